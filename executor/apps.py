from django.apps import AppConfig


class ExecutorConfig(AppConfig):
    name = "executor"
    verbose_name = "Executor"

    def ready(self):
        # Spending real money is opt-in: REAL_PROVIDERS=1 with no provider key refuses to start (every
        # process: web, workers, management commands), with a message naming the variables to set.
        from executor.providers.real import check_real_providers  # ready(): settings and apps are loaded

        check_real_providers()
