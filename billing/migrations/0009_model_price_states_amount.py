"""An override of the rate card states an amount (billing.models.ModelPrice, model_price_states_amount).

A row written before the rule with no amount priced its model at the penalty tier and left its cost
unpriced; what it was meant to say is not on the row, so this migration does not guess: it stops, naming
each such model, before adding the constraint. Give each an amount (or drop the override, so the models
file's or the code's price applies) with the previous release's admin or SQL, then migrate again."""

from django.db import migrations, models
from django.db.models import Q

STATES_AMOUNT = (Q(free=True) | Q(per_unit_usd__isnull=False) | Q(variants__isnull=False)
                 | (Q(input_per_mtok_usd__isnull=False) & Q(output_per_mtok_usd__isnull=False)))


def refuse_rows_without_an_amount(apps, schema_editor):
    ModelPrice = apps.get_model("billing", "ModelPrice")
    empty = list(ModelPrice.objects.exclude(STATES_AMOUNT).values_list("model", flat=True))
    if empty:
        raise RuntimeError(
            "billing.0009: these rate card overrides state no amount (their models are priced at the penalty "
            f"tier): {', '.join(sorted(empty))}. Give each a price, or delete the override "
            "(DELETE FROM billing_modelprice WHERE model = '...'), then run migrate again.")


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0008_price_drift"),
    ]

    operations = [
        migrations.RunPython(refuse_rows_without_an_amount, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="modelprice",
            constraint=models.CheckConstraint(condition=STATES_AMOUNT, name="model_price_states_amount"),
        ),
    ]
