"""The tests' shared helpers, imported as a library (``from tests.support.processes import start_workers``).

A conftest holds fixtures only and is never imported; fixtures several directories use live in
``tests/support/fixtures.py`` (a plugin the root conftest loads).
"""
