"""Developer tools of a kvcheck clone, outside the installed package: each runs as
``python tools/NAME.py`` from the clone's root, with kvcheck installed (``pip install -e .``).

- ``reach.py``: line coverage of a target's pool code under the shipped suite;
- ``call_counts.py``: the suite's calls per pool variant x method x argument;
- ``across.py``: the findings of the same seeds against several releases of a target.

They may import kvcheck; kvcheck never imports them (tests/test_layering.py).
"""
