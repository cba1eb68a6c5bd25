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
        from django.core.exceptions import ImproperlyConfigured

        from billing import rates  # ready(): settings and apps are loaded
        from executor.registry import check_models_file  # ready(): its models import the app's models

        problems = check_models_file()
        if not problems:
            rates.forget_overrides()
            try:
                rates.file_prices_check()
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ImproperlyConfigured("; ".join(problems))
