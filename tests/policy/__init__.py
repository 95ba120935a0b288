"""Pure policy tests: no store, no log, no server. With ``tests/adapters`` the fast loop (see ``tests/conftest.py``)."""
