"""Docstring examples in kvcheck.pools run, and every public name is documented."""

from __future__ import annotations

import doctest
import inspect

import pytest

import kvcheck.pools
from kvcheck.pools import _checks, _dtypes, _host_copy, _index_k, _rows, base, dsa, mha, mla, noop

MODULES = [kvcheck.pools, base, mha, noop, mla, dsa, _checks, _dtypes, _rows, _host_copy, _index_k]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples_pass(module):
    """Each module's examples run and print what their docstrings say."""
    results = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0
    assert results.failed == 0


@pytest.mark.parametrize("name", kvcheck.pools.__all__)
def test_public_classes_and_methods_have_docstrings(name):
    """Every exported class and each of its public methods has a docstring."""
    cls = getattr(kvcheck.pools, name)
    assert inspect.getdoc(cls)
    for attr, member in inspect.getmembers(cls):
        if not attr.startswith("_") and (
            inspect.isfunction(member) or isinstance(member, property)
        ):
            assert inspect.getdoc(member), f"{name}.{attr} has no docstring"
