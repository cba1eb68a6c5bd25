from django.apps import AppConfig


class ExecutorConfig(AppConfig):
    name = "executor"
    verbose_name = "Executor"

    def ready(self):
        # Spending real money is opt-in: REAL_PROVIDERS=1 with no provider key refuses to start (every
        # process: web, workers, management commands), with a message naming the variables to set.
        from executor.providers.real import check_real_providers  # ready(): settings and apps are loaded

        check_real_providers()
        # A models file that cannot be read, or an entry in it that is wrong, refuses to start too, each
        # problem named (executor.registry; the admin's form refuses a wrong row where it is written).
        # The file is one document, a model's spec and its price: the registry reads and checks it whole,
        # and hands its prices down to the rate card (a port: billing stands below the executor).
        from django.core.exceptions import ImproperlyConfigured

        from billing import rates  # ready(): settings and apps are loaded
        from executor import registry  # ready(): its models import the app's models

        rates.file_prices_from = registry.file_prices
        problems = registry.check_models_file()
        rates.forget_overrides()
        if problems:
            raise ImproperlyConfigured("; ".join(problems))
