"""Session-log backends: SQLite (embedded default) and PostgreSQL (many replicas) (proxy layer)."""
