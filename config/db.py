"""Create the database named by DATABASE_URL when it is missing (docs/api.md, "Settings": the database
is created if missing), so a fresh machine needs no manual `createdb`."""

import psycopg
from psycopg import errors, sql


def connect_kwargs(database: dict, dbname: str) -> dict:
    """psycopg's connect() arguments for a Django database's settings, on `dbname`, autocommitted (Django's
    own pool options left out)."""
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
        with psycopg.connect(**connect_kwargs(database, name)):
            return False
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    with psycopg.connect(**connect_kwargs(database, "postgres")) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except errors.DuplicateDatabase:
            # Another process (a second `make migrate`) created it between our two connections.
            return False
    return True


# SQLSTATE classes (PostgreSQL, appendix A): 22 data exception (a value too long for its column, out of
# range, not valid for its type), 23 integrity constraint violation (a check, not-null or foreign key).
_RECURRING_CLASSES = ("22", "23")
# Two writers racing on one key: the second try reads the winner's row instead, so these pass.
_RACES = ("23505", "23P01")  # unique_violation, exclusion_violation


def db_error_recurs(exc: BaseException) -> bool:
    """Whether a database error (Django's wrapper, or psycopg's own) would come back if the same work ran
    again with the same values: a value the column cannot hold, a check that refuses it. Those end the
    work instead of retrying it for ever. Everything else (a connection cut, a restart, a deadlock, a
    serialisation failure, a unique key another writer took first) may pass, and is retried as before."""
    error = exc if getattr(exc, "sqlstate", None) else exc.__cause__
    sqlstate = getattr(error, "sqlstate", None) or ""
    return sqlstate[:2] in _RECURRING_CLASSES and sqlstate not in _RACES
