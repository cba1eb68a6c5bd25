"""Test settings: the real settings, pointed at a Redis database of their own so a test run never
consumes (or flushes) the messages of a stack started by `make run`. Every value can still be overridden
from the environment (for example BROKER_URL=amqp://... to run the suite on RabbitMQ).

Under pytest-xdist every worker is a process of its own that imports this module again, and inherits the
environment of the controller, which may have imported it first: a default this module set there is
recorded in _PAYONCE_TEST_DEFAULTS and set afresh in each worker (its own Redis server, tests/support/
redis_server.py, and its own PAYONCE_VAR_DIR), while a value the caller gave is kept."""

import os
import tempfile

from tests.support import redis_server
from tests.support.procs import free_port

_DEFAULTED = "_PAYONCE_TEST_DEFAULTS"
_defaulted = set(filter(None, os.environ.get(_DEFAULTED, "").split(",")))


def _default(name: str, value: str) -> None:
    """os.environ.setdefault, except that a default inherited from the process that started this one is
    not a value the caller gave: it is replaced by this process's own."""
    if name not in os.environ or name in _defaulted:
        os.environ[name] = value
        _defaulted.add(name)


_default("BROKER_URL", redis_server.url(15))
# A key of the suite's own, never the repository's development key: the processes the suite starts run
# with DEBUG off, and refuse that key (config.startup); they inherit this one, so the links a worker
# signs are read by the test process.
_default("SECRET_KEY", "payonce-test-suite-" + "k" * 40)
_default("PAYONCE_VAR_DIR", os.path.join(tempfile.gettempdir(), f"payonce-test-{os.getpid()}"))
_default("OUTPUT_STORE_URL", "file://" + os.path.join(os.environ["PAYONCE_VAR_DIR"], "outputs"))
_default("POLL_INTERVAL_S", "0.5")
os.environ[_DEFAULTED] = ",".join(sorted(_defaulted))
# The suite starts its own sandbox on a free port (tests/conftest.py), never one a developer runs.
os.environ["SANDBOX_URL"] = f"http://127.0.0.1:{os.environ.get('TEST_SANDBOX_PORT') or free_port()}"

from config.settings import *  # noqa: E402,F401,F403
