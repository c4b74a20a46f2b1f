"""Change sources: PostgreSQL logical replication (`postgres/`) and SQLite triggers (`sqlite/`)."""
