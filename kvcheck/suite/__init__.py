"""The property suite shipped with kvcheck, so an installed kvcheck can verify a target.

Run it with ``kvcheck verify`` (summary, exit status) or directly with
``pytest --pyargs kvcheck.suite [--kvcheck-target T] [--kvcheck-device D] [-n auto]``.
Its tests reach the implementation only through the ``kvcheck_target`` fixture and mark
the capabilities they need with ``@pytest.mark.kvcheck_needs``, so a target that lacks one
gets a skip with its reason. kvcheck's own tests live in the repository's ``tests/``.
"""
