"""Durable video jobs: the job store (one SQL schema on SQLite or PostgreSQL) and the
artifact directory."""
