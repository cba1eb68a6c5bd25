"""Small SQL helpers the ORM does not offer: an INSERT that does nothing on conflict and says whether it
inserted (the primitive under every "second call sees the first" guarantee)."""

from django.db import connection


def insert_ignore(instance, *, conflict: str | None = None) -> bool:
    """INSERT the model instance; on a unique violation do nothing. True if this call inserted the row.

    `conflict` names a constraint (ON CONFLICT ON CONSTRAINT ...); without it any unique key counts.
    """
    model = type(instance)
    fields = model._meta.concrete_fields
    quote = connection.ops.quote_name
    target = f" ON CONSTRAINT {quote(conflict)}" if conflict else ""
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields if not _auto(f))})"
        f" VALUES ({', '.join('%s' for f in fields if not _auto(f))})"
        f" ON CONFLICT{target} DO NOTHING RETURNING {quote(model._meta.pk.column)}"
    )
    values = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields if not _auto(f)]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None:
        return False
    setattr(instance, model._meta.pk.attname, row[0])
    instance._state.adding = False
    return True


def _auto(field) -> bool:
    return getattr(field, "db_returning", False) and field.primary_key
