from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from jobs import recipes, schema  # noqa: F401  (register the recipes and the OpenAPI auth extension)
