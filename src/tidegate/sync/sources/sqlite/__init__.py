"""The SQLite change source: triggers that write an outbox in the writing transaction."""
