"""The Django admin: the operators' room (docs/operating.md, "The admin"). One module per app whose rows it
shows; every action goes through operators.adminkit's confirmation and operators.operations' audit row."""

from operators.admin import accounts, billing, catalog, jobs, orders, report_templates, webhooks  # noqa: F401  (each registers its ModelAdmins)
