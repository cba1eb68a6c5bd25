"""Small SQL helpers the ORM does not offer: an INSERT that does nothing on conflict and says whether it
inserted (the primitive under every "second call sees the first" guarantee), and the name of the
constraint an IntegrityError violated (so each caller catches its own constraint alone)."""

from functools import lru_cache

from django.db import connection
from django.db.models.sql import UpdateQuery


@lru_cache(maxsize=None)
def _insert_sql(model, conflict: str | None) -> tuple[str, tuple]:
    fields = tuple(f for f in model._meta.concrete_fields if not (f.primary_key and f.db_returning))
    quote = connection.ops.quote_name
    target = f" ON CONSTRAINT {quote(conflict)}" if conflict else ""
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)})"
        f" VALUES ({', '.join('%s' for _ in fields)})"
        f" ON CONFLICT{target} DO NOTHING RETURNING {quote(model._meta.pk.column)}"
    )
    return sql, fields


def insert_ignore(instance, *, conflict: str | None = None) -> bool:
    """INSERT the model instance; on a unique violation do nothing. True if this call inserted the row.

    `conflict` names a constraint (ON CONFLICT ON CONSTRAINT ...); without it any unique key counts.
    """
    model = type(instance)
    sql, fields = _insert_sql(model, conflict)
    values = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None:
        return False
    setattr(instance, model._meta.pk.attname, row[0])
    instance._state.adding = False
    return True


def violated_constraint(exc) -> str | None:
    """The name of the constraint a django.db.IntegrityError violated (psycopg's diagnostics), or None."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def update_sql(queryset, fields: dict) -> tuple[str, list]:
    """The UPDATE that `queryset.update(**fields)` would run, as SQL and parameters, for a caller that
    runs it as one part of a larger statement (a CTE) instead."""
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(fields)
    sql, params = query.get_compiler(queryset.db).as_sql()
    return sql, list(params)
