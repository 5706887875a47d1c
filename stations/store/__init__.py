"""Storage: the only package that speaks SQL (engines, schema, migrations, the group-commit
writer, LISTEN/NOTIFY, id runs and the queries the domain runs)."""
