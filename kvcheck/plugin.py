"""pytest plugin for kvcheck (registered through the ``pytest11`` entry point)."""
