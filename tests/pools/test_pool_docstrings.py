"""Every public name of kvcheck.pools is documented (the README's test command runs the
examples of every kvcheck module, ``--doctest-modules``)."""

from __future__ import annotations

import inspect

import pytest

import kvcheck.pools


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
