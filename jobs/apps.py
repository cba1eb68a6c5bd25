from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from jobs.api import schema  # noqa: F401  (register the OpenAPI auth extension)
        # The histograms' job labels are bounded by the kinds table and the terminal statuses, which config
        # (below every app) cannot read: handed down here, once (config.metrics.Declared).
        from config import metrics  # ready(): beside the imports above
        from jobs.kinds import KINDS  # ready(): the kinds' steps import the app's models
        from jobs.models import TERMINAL_STATUSES  # ready(): the app's models are loaded

        metrics.JOB_KINDS.declare(KINDS)
        metrics.JOB_END_STATUSES.declare(TERMINAL_STATUSES)
