"""Fuzz the API against its own OpenAPI document with schemathesis, longer than `make test` does:
`make fuzz-api`.

Runs tests/e2e/test_fuzz_api.py (the same stack, hooks and checks: no 5xx, every answer as the schema says,
no 4xx that wrote a row, queued a task or called a provider, and the books after a worker ran what was
queued) with more examples per operation and the seed asked for, on a database of its own
(test_payonce_fuzz, so a `make test` running at the same time keeps its test_payonce). Exits with
pytest's status.

    python tests/fuzz/api_schemathesis.py [--max-examples N] [--seed N] [--schemathesis-args "--checks all"]
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-examples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", "20260101")))
    parser.add_argument("--schemathesis-args", default="", help="more arguments for `schemathesis run`")
    args = parser.parse_args()
    env = {**os.environ, "FUZZ_MAX_EXAMPLES": str(args.max_examples), "FUZZ_SEED": str(args.seed),
           "FUZZ_SCHEMATHESIS_ARGS": args.schemathesis_args,
           "DATABASE_URL": os.environ.get("FUZZ_DATABASE_URL", "postgres://localhost:5432/payonce_fuzz")}
    command = [sys.executable, "-m", "pytest", "tests/e2e/test_fuzz_api.py", "-s"]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
