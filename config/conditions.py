"""A rule declared once, as a Django `Q` of plain lookups on one model's own columns, and read three ways:
the ORM takes the `Q` itself (filter, exclude, an aggregate's filter=), `sql()` writes it out for raw SQL
under a table alias, and `holds()` evaluates it on an instance already loaded. So a rule such as "this
attempt was paid" has one home instead of a SQL string, a property and a `Q` kept alike by hand.

Only what such rules need: AND and OR of `field`, `field__isnull`, `field__gt` (and the other orderings)
and `field__in`, with constant strings and integers. A negation is refused: on a nullable column Django's
NOT adds an `IS NOT NULL` that plain SQL does not, and the three readings would part ways there."""

import operator

from django.db.models import Q

_SQL_OPERATORS = {"exact": "=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_PYTHON_OPERATORS = {"exact": operator.eq, "gt": operator.gt, "gte": operator.ge, "lt": operator.lt,
                     "lte": operator.le}


def _lookup(lookup: str) -> tuple[str, str]:
    name, _, op = lookup.partition("__")
    op = op or "exact"
    if op not in _SQL_OPERATORS and op not in ("isnull", "in"):
        raise ValueError(f"{lookup}: only exact, isnull, in, gt, gte, lt and lte are read three ways")
    return name, op


def _checked(condition: Q) -> Q:
    if condition.negated or not condition.children:
        raise ValueError(f"{condition!r}: a negated or empty condition is not read three ways (see the module)")
    return condition


def _literal(value) -> str:
    # The rules' values are constants of the code (a state's name, a count), never a request's: written
    # into the statement, so a rule fits any raw SQL without parameters of its own.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return "'" + str.__str__(value).replace("'", "''") + "'"
    raise TypeError(f"{value!r}: only strings and integers are written into SQL")


def sql(condition: Q, model, alias: str) -> str:
    """The condition as a SQL boolean expression over `model`'s table under `alias`."""
    parts = []
    for child in _checked(condition).children:
        if isinstance(child, Q):
            parts.append(f"({sql(child, model, alias)})")
            continue
        lookup, value = child
        name, op = _lookup(lookup)
        column = f"{alias}.{model._meta.get_field(name).column}"
        if op == "isnull":
            parts.append(f"{column} IS {'' if value else 'NOT '}NULL")
        elif op == "in":
            parts.append(f"{column} IN ({', '.join(_literal(item) for item in value)})")
        else:
            parts.append(f"{column} {_SQL_OPERATORS[op]} {_literal(value)}")
    return f" {condition.connector} ".join(parts)


def case_sql(answers, default, model, alias: str) -> str:
    """`CASE WHEN ... THEN ... ELSE default END` of ((answer, condition), ...): the first that holds."""
    whens = " ".join(f"WHEN {sql(condition, model, alias)} THEN {_literal(answer)}" for answer, condition in answers)
    return f"CASE {whens} ELSE {_literal(default)} END"


def holds(condition: Q, instance) -> bool:
    """Whether the condition holds for `instance`, as the database would answer on its row."""
    results = (holds(child, instance) if isinstance(child, Q) else _lookup_holds(*child, instance)
               for child in _checked(condition).children)
    return all(results) if condition.connector == Q.AND else any(results)


def _lookup_holds(lookup: str, value, instance) -> bool:
    name, op = _lookup(lookup)
    actual = getattr(instance, instance._meta.get_field(name).attname)
    if op == "isnull":
        return (actual is None) == value
    if actual is None:
        return False  # SQL: a comparison with NULL is not true (and no NOT can turn it around: _checked)
    if op == "in":
        return actual in value
    return _PYTHON_OPERATORS[op](actual, value)
