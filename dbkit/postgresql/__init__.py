"""Django's PostgreSQL backend with the pool's check of `dbkit.pool` and a fast reader of
`timestamptz` values (ENGINE "dbkit.postgresql")."""
