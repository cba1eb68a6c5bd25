"""Fuzz the API against its own OpenAPI document with schemathesis: `make fuzz-api`.

Starts `web`, `worker` and `sandbox` as the Procfile starts them, on a database, a Redis database and an
output directory of their own (never a developer's `make run` stack), makes a client, and runs
schemathesis with a real key and the response conformance checks on: no 5xx, every status code, content
type, header and body as the schema says. Exits with schemathesis's status.

    python tests/fuzz/api_schemathesis.py [--max-examples N] [--seed N]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-examples", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    var = Path(tempfile.mkdtemp(prefix="payonce-fuzz-"))
    port, sandbox_port = free_port(), free_port()
    env = {**os.environ, "DATABASE_URL": os.environ.get("FUZZ_DATABASE_URL", "postgres://localhost:5432/payonce_fuzz"),
           "BROKER_URL": "redis://127.0.0.1:6379/8", "PAYONCE_VAR_DIR": str(var), "PORT": str(port),
           "SANDBOX_PORT": str(sandbox_port), "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
           "OUTPUT_STORE_URL": f"file://{var}/outputs", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    client = json.loads(subprocess.run([python, "manage.py", "create_client", "fuzz"], cwd=ROOT, env=env,
                                       check=True, capture_output=True, text=True).stdout)
    stack = subprocess.Popen(["honcho", "start", "-f", "Procfile", "-p", str(port), "web", "worker", "sandbox"],
                             cwd=ROOT, env=env, stdout=open(var / "stack.log", "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/v1/schema", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or stack.poll() is not None:
                print((var / "stack.log").read_text()[-4000:], file=sys.stderr)
                return 2
            time.sleep(0.2)
        run = subprocess.run(
            ["schemathesis", "run", f"{base}/v1/schema", "-H", f"Authorization: Bearer {client['api_key']}",
             "--checks", CHECKS, "--max-examples", str(args.max_examples), "--seed", str(args.seed)],
            cwd=ROOT, env=env,
        )
        return run.returncode
    finally:
        os.killpg(stack.pid, signal.SIGTERM)
        stack.wait(timeout=30)
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
