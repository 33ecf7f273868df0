"""Collection of the trainer tests."""

# a plugin registers its cell, memory and backend when imported: only the tests that ask for
# it import it (and remove what it registered), never the collection of doctests
collect_ignore = ["toy_plugin.py"]
