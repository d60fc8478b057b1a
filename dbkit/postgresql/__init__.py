"""Django's PostgreSQL backend with the pool's check of `dbkit.pool` (ENGINE "dbkit.postgresql")."""
