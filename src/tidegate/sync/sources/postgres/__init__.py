"""The PostgreSQL change source: pgoutput logical replication, its catalog and its verify reader."""
