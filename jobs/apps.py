from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from jobs.api import schema  # noqa: F401  (register the OpenAPI auth extension)
