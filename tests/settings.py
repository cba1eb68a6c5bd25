"""Test settings: the real settings, pointed at a Redis database of their own so a test run never
consumes (or flushes) the messages of a stack started by `make run`. Every value can still be overridden
from the environment (for example BROKER_URL=amqp://... to run the suite on RabbitMQ)."""

import os
import tempfile

from tests.support.procs import free_port

os.environ.setdefault("BROKER_URL", "redis://127.0.0.1:6379/15")
# A key of the suite's own, never the repository's development key: the processes the suite starts run
# with DEBUG off, and refuse that key (config.startup); they inherit this one, so the links a worker
# signs are read by the test process.
os.environ.setdefault("SECRET_KEY", "payonce-test-suite-" + "k" * 40)
os.environ.setdefault("PAYONCE_VAR_DIR", os.path.join(tempfile.gettempdir(), f"payonce-test-{os.getpid()}"))
os.environ.setdefault("OUTPUT_STORE_URL", "file://" + os.path.join(os.environ["PAYONCE_VAR_DIR"], "outputs"))
os.environ.setdefault("POLL_INTERVAL_S", "0.5")
# The suite starts its own sandbox on a free port (tests/conftest.py), never one a developer runs.
os.environ["SANDBOX_URL"] = f"http://127.0.0.1:{os.environ.get('TEST_SANDBOX_PORT') or free_port()}"

from config.settings import *  # noqa: E402,F401,F403
