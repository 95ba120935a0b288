"""The session-log layer: the SQLite and PostgreSQL logs and their contract, the fold cache."""
