from django.apps import AppConfig


class ExecutorConfig(AppConfig):
    name = "executor"
    verbose_name = "Executor"

    def ready(self):
        # Spending real money is opt-in: REAL_PROVIDERS=1 with no provider key refuses to start (every
        # process: web, workers, management commands), with a message naming the variables to set.
        from executor.providers.real import check_real_providers  # ready(): settings and apps are loaded

        check_real_providers()
        # Each provider's spec declares the secrets to keep out of every log line (its key's shape, its key
        # and callback secret settings); config.logs stands below the executor and cannot read the specs,
        # so they are handed down to it here, once (config.logs.register_secrets says why and how).
        from config.logs import register_secrets  # ready(): beside the import above
        from executor.providers import PROVIDERS  # ready(): the adapters import the app's models

        register_secrets(shapes=[(shape.needle, shape.pattern) for spec in PROVIDERS for shape in spec.secret_shapes],
                         names=[name for spec in PROVIDERS for name in spec.secret_settings])
        # So are the providers' names, the values of the histograms' `provider` label (config.metrics.Declared).
        from config.metrics import PROVIDERS as PROVIDER_LABEL  # ready(): beside the imports above

        PROVIDER_LABEL.declare(spec.name for spec in PROVIDERS)
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
