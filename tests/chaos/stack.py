"""The storm's stack: every Procfile process as a real process (each in a network namespace of its own
with HOSTS=1), the sandbox provider, a moto S3 server (HOSTS=1) and the services they reach, on a
PostgreSQL server (tests/chaos/pgserver.py), a broker database (or RabbitMQ vhost) and an output store of
the storm's own. The machine's PostgreSQL cluster is never touched: the storm restarts its own server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.chaos.pgserver import PrivateServer
from tests.support.procs import FAST_RECOVERY, REPO_ROOT, ProcfileProcess, free_port, payonce_env, procfile_command

START_TIMEOUT_S = 60  # six processes start at once, and again after each kill, on a busy machine


class Stack:
    """Everything a storm runs against. `hosts` (tests.chaos.hosts.Hosts, or None) puts web, the two
    workers, webhooks and beat each in a namespace of its own. `redis` is the loopback Redis (host:port)
    whose database `redis_db` is the broker: the machine's, or the private one of an xdist worker."""

    def __init__(self, *, broker: str, database: str, redis_db: int, hosts=None, workers: int = 2,
                 redis: str = "127.0.0.1:6379"):
        self.broker, self.database, self.redis_db, self.hosts, self.workers = broker, database, redis_db, hosts, workers
        self.workdir = Path(tempfile.mkdtemp(prefix="payonce-chaos-"))
        self.procs: dict[str, ProcfileProcess] = {}
        # The checkout whose code payonce's processes and manage.py run: this one, or for the upgrade storm
        # the previous release's at first (tests/chaos/upgrade.py). The sandbox, the provider, is this one's.
        self.root = REPO_ROOT
        self.moto = None
        gateway = hosts.gateway if hosts else "127.0.0.1"
        self.service_host = gateway  # where PostgreSQL, Redis, RabbitMQ, the sandbox and S3 are reached
        self.web_host = hosts.address("web") if hosts else "127.0.0.1"
        self.web_port, self.sandbox_port = free_port(), free_port()
        self.web_url = f"http://{self.web_host}:{self.web_port}"
        self.sandbox_url = f"http://{gateway}:{self.sandbox_port}"
        # The storm's own PostgreSQL on a free port of 127.0.0.1 (started by prepare()); with HOSTS=1 the
        # hosts reach it through a forwarder on the gateway, as they reach Redis and RabbitMQ.
        self.pg = PrivateServer(free_port())
        pg = hosts.forward(self.pg.port) if hosts else None
        self.database_url = self.pg.url(database, pg)
        self.local_database_url = self.pg.url(database)
        if broker == "amqp":
            rabbit = hosts.forward(5672) if hosts else "127.0.0.1:5672"
            self.vhost = database
            self.broker_url = f"amqp://guest:guest@{rabbit}/{self.vhost}"
            self.local_broker_url = f"amqp://guest:guest@127.0.0.1:5672/{self.vhost}"
            cache = ""
        else:
            reached = hosts.forward(int(redis.rsplit(":", 1)[1])) if hosts else redis
            self.broker_url = f"redis://{reached}/{redis_db}"
            self.local_broker_url = f"redis://{redis}/{redis_db}"
            cache = self.broker_url
        # A models file in force from the start (the storm writes it wrong, then right, while jobs run): it
        # states the sandbox's own prices, so while it is in force nothing changes but that it is read.
        self.models_file = self.workdir / "models.json"
        self.write_models_file(valid=True)
        self.metrics_token = "storm-metrics-token"
        self.env = payonce_env(**{
            "DATABASE_URL": self.database_url,
            "BROKER_URL": self.broker_url,
            "CACHE_URL": cache,
            "SANDBOX_URL": self.sandbox_url,
            "PAYONCE_VAR_DIR": self.workdir / "var",
            "PORT": self.web_port,
            "HOST": self.web_host,
            "ALLOWED_HOSTS": f"127.0.0.1,localhost,{self.web_host}",
            "PUBLIC_BASE_URL": self.web_url,
            "PROVIDER_CALLBACK_BASE_URL": self.web_url,
            "EMAIL_URL": "console://",
            "WORKER_PROCESSES": "1",  # the storm starts its workers one by one, and kills them one by one
            "MODELS_FILE": self.models_file, "MODELS_CACHE_S": "1", "METRICS_TOKEN": self.metrics_token,
            # Recovery in seconds, not minutes, so a storm fits a CI run.
            **FAST_RECOVERY,
            "POLL_MAX_INTERVAL_S": "3", "RETRY_BACKOFF_MAX_S": "5", "WAIT_DEADLINE_S": "90",
            "PROVIDER_READ_TIMEOUT_S": "10", "LLM_READ_TIMEOUT_S": "10",
            # The receiver fails 30% of deliveries: eleven tries in about 40 s make a dead letter a one in a
            # million event, so a dead letter in the storm means a bug, not bad luck.
            "WEBHOOK_ALLOW_PRIVATE": "1", "WEBHOOK_RETRY_SCHEDULE": "1,1,2,2,3,3,4,5,5,6,6",
            "WEBHOOK_SEND_LEASE_S": "3", "WEBHOOK_FIRST_TRY_GRACE_S": "1", "WEBHOOK_DRAIN_INTERVAL_S": "1",
        })
        if hosts:
            self.env.update({"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos",
                             "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
                             "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"})
        else:
            self.env["OUTPUT_STORE_URL"] = f"file://{self.workdir / 'outputs'}"
        self.local_env = {**self.env, "DATABASE_URL": self.local_database_url,
                          "BROKER_URL": self.local_broker_url,
                          "CACHE_URL": self.local_broker_url if broker == "redis" else ""}

    # -- set-up ------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """A fresh PostgreSQL server, database and broker of the storm's own; the S3 bucket with HOSTS=1."""
        self.pg.start()
        self.pg.create_database(self.database)
        if self.broker == "amqp":
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.vhost], capture_output=True)
            subprocess.run(["rabbitmqctl", "-q", "add_vhost", self.vhost], check=True, capture_output=True)
            subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*"],
                           check=True, capture_output=True)
        else:
            import redis

            redis.Redis.from_url(self.local_broker_url).flushdb()
        if self.hosts:
            from tests.support.moto_server import MotoServer

            self.moto = MotoServer(host=self.service_host).start()
            self.env["AWS_ENDPOINT_URL"] = self.local_env["AWS_ENDPOINT_URL"] = self.moto.url
            self.env["OUTPUT_STORE_URL"] = self.local_env["OUTPUT_STORE_URL"] = "s3://chaos-outputs/payonce"
            self.s3().create_bucket(Bucket="chaos-outputs")
        self.manage("migrate", "--noinput")

    def s3(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.moto.url, aws_access_key_id="chaos",
                            aws_secret_access_key="chaos", region_name="us-east-1")

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=self.root, env=self.local_env, check=True,
                              capture_output=True, text=True).stdout

    def create_client(self, name: str, webhook_url: str, cap: str) -> dict:
        return json.loads(self.manage("create_client", name, "--webhook-url", webhook_url, "--monthly-cap-usd", cap))

    def _process(self, name: str, command=None, ready: str | None = None, **env) -> ProcfileProcess:
        """`name` as the Procfile starts it (or `command`); with HOSTS=1 in the network namespace of `name`,
        but for the sandbox, which stays in the root namespace with the other services."""
        wrap = (lambda argv: self.hosts.command(name, argv)) if self.hosts and name != "sandbox" else None
        return ProcfileProcess(name, env, command, base=self.env, log_dir=self.workdir, wrap=wrap, ready=ready,
                               start_timeout=START_TIMEOUT_S, root=REPO_ROOT if name == "sandbox" else self.root)

    def start(self) -> None:
        self.procs["sandbox"] = self._process("sandbox", SANDBOX_HOST=self.service_host,
                                              SANDBOX_PORT=self.sandbox_port,
                                              SANDBOX_STATE_DIR=self.workdir / "sandbox")
        self.procs["web"] = self._process("web")
        for n in range(self.workers):
            # Two workers on one machine need two node names (Celery warns about a clash otherwise). The line
            # of the release each start runs (an upgrade starts the workers again on the other one's code).
            def command(root, n=n):
                return procfile_command("worker", root).replace("--hostname jobs@%h", f"--hostname jobs{n}@%h")
            self.procs[f"worker{n}"] = self._process(f"worker{n}", command, ready=ProcfileProcess.READY["worker"])
        self.procs["webhooks"] = self._process("webhooks")
        self.procs["beat"] = self._process("beat")
        for proc in self.procs.values():  # all at once, then each waited for: a second start-up, not six
            proc.launch()
        for proc in self.procs.values():
            proc.ready_within(START_TIMEOUT_S)

    # -- what operators change ----------------------------------------------------------------------

    def write_models_file(self, *, valid: bool) -> None:
        """The models file, right (the sandbox's blind model at its own price) or wrong (a negative price
        and a flag that is a string: every process must refuse it and keep the one in force). Written
        whole and renamed into place, as a deploy does."""
        price = "0.04" if valid else "-0.04"
        entry = {"name": "sandbox/image-blind", "price": {"per_unit": price, "unit": "image"}}
        if not valid:
            entry["enabled"] = "false"
        staged = self.models_file.with_suffix(".tmp")
        staged.write_text(json.dumps({"models": [entry]}))
        os.replace(staged, self.models_file)

    def metrics(self) -> str:
        import requests

        return requests.get(f"{self.web_url}/metrics", headers={"Authorization": f"Bearer {self.metrics_token}"},
                            timeout=15).text

    # -- faults ------------------------------------------------------------------------------------

    def flush_broker(self) -> None:
        """Lose every queued and unacknowledged message of this storm's broker (nobody else's)."""
        if self.broker == "amqp":
            from kombu import Connection

            with Connection(self.local_broker_url) as conn:
                for queue in ("jobs", "webhooks"):
                    try:
                        conn.default_channel.queue_purge(queue)
                    except Exception:  # a queue not declared yet has nothing to lose
                        pass
        else:
            import redis

            redis.Redis.from_url(self.local_broker_url).flushdb()

    def restart_postgres(self) -> float:
        """Restart the storm's PostgreSQL (fast shutdown: every connection is cut); returns when it answers."""
        return self.pg.restart()

    def cut_connections(self) -> int:
        """pg_terminate_backend on every connection of web, the workers, webhooks and beat (the storm's own
        checker connections stay); returns how many were cut."""
        return self.pg.terminate_backends(self.database)

    def crash_sandbox(self) -> None:
        """SIGKILL the sandbox's server (its supervisor brings it back with the journal's ledger)."""
        for pid in self.procs["sandbox"].children():
            os.kill(pid, signal.SIGKILL)

    def outputs(self) -> set[str]:
        """The keys in the output store right now."""
        if self.moto is not None:
            keys, token = set(), None
            while True:
                page = self.s3().list_objects_v2(Bucket="chaos-outputs", **({"ContinuationToken": token} if token else {}))
                keys.update(item["Key"] for item in page.get("Contents", []))
                if not page.get("IsTruncated"):
                    return keys
                token = page["NextContinuationToken"]
        base = self.workdir / "outputs"
        return {str(path.relative_to(base)) for path in base.rglob("*") if path.is_file()} if base.exists() else set()

    def stop(self, keep: bool = False) -> None:
        # The checks have read everything: no warm shutdown to wait for (a worker holding countdown
        # tasks would take its whole grace), every process dies at once.
        try:
            for proc in self.procs.values():
                proc.kill()
            if self.moto is not None:
                self.moto.stop()
            if self.broker == "amqp":
                subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.vhost], capture_output=True)
        finally:
            if keep and self.pg.log_path.exists():
                shutil.copy(self.pg.log_path, self.workdir / "postgres.log")
            self.pg.stop()  # by its PID; its directory removed (also when a kill above failed)
        if keep:
            print(f"logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
