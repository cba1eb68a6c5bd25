"""Create the database named by DATABASE_URL when it is missing (API.md: "the database is created if
missing"), so a fresh machine needs no manual `createdb`."""

import psycopg
from psycopg import errors, sql


def _connect_kwargs(database: dict, dbname: str) -> dict:
    kwargs = {"dbname": dbname, "autocommit": True, "connect_timeout": 10}
    for key, setting in (("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"), ("port", "PORT")):
        if database.get(setting):
            kwargs[key] = database[setting]
    for key, value in database.get("OPTIONS", {}).items():
        if key not in {"pool", "server_side_binding", "isolation_level", "assume_role"}:
            kwargs[key] = value
    return kwargs


def ensure_database(database: dict) -> bool:
    """Create `database["NAME"]` if it does not exist. Returns True when it was created."""
    name = database["NAME"]
    try:
        with psycopg.connect(**_connect_kwargs(database, name)):
            return False
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    with psycopg.connect(**_connect_kwargs(database, "postgres")) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except errors.DuplicateDatabase:
            # Another process (a second `make migrate`) created it between our two connections.
            return False
    return True
