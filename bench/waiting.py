"""Benchmark: what waiting on one long render costs (docs/design.md, "Waiting costs little"), in provider polls and
Celery messages per job, against what it cost when every job was polled every POLL_INTERVAL_S.

Three phases of `--jobs` `media` jobs, each a `--render-s` (60 s) render on sandbox/video-keyed, run by
`web`, `worker` and the sandbox as the Procfile starts them (the sandbox calls back to `web`):

  callbacks           the sandbox says how long the render takes and calls back when it ends
  callbacks, no word  the sandbox says nothing of the duration (as Replicate does) and calls back
  no callbacks        the sandbox says nothing and its callbacks are dropped: the poll schedule alone

Polls are counted from the sandbox's call log; messages are the worker's `received` lines. The baseline
is the fixed-interval poller this replaced: one poll and one message per POLL_INTERVAL_S of render.
Targets (issue 12): with callbacks <= 4 polls and <= 6 messages per job; without <= 10 polls.
Run: `.venv/bin/python bench/waiting.py [--jobs 20] [--render-s 60]`.
"""

import argparse
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.e2e_throughput import post_jobs, received  # noqa: E402
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

PHASES = (
    ("callbacks", {}, False),
    ("callbacks, no word", {"expected_s": None}, False),
    ("no callbacks", {"expected_s": None}, True),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--render-s", type=float, default=60.0)
    args = parser.parse_args()

    stack = Stack()
    stack.env["PROVIDER_CALLBACK_BASE_URL"] = f"http://127.0.0.1:{stack.port}"
    credentials = stack.prepare()
    stack.configure_this_process()
    from django.conf import settings

    from jobs.models import Job

    sandbox = stack.env["SANDBOX_URL"]
    jobs = Job.objects.filter(client_id=credentials["client_id"])
    results = []
    try:
        stack.start("sandbox")
        stack.start("web")
        stack.start("worker")
        for name, params, drop in PHASES:
            requests.post(f"{sandbox}/control/reset", timeout=10)
            if drop:
                requests.post(f"{sandbox}/control/faults", timeout=10, json={"faults": [
                    {"model": "video-keyed", "action": "drop_callback", "times": args.jobs}]})
            messages = received(stack)
            body = {"kind": "media", "models": ["sandbox/video-keyed"],
                    "input": {"prompt": f"a long render ({name})", "render_s": args.render_s, **params}}
            started = time.time()
            post_jobs(stack.port, credentials["api_key"], args.jobs, body=body, threads=4)
            while jobs.filter(status__in=["queued", "running", "waiting"]).exists():
                time.sleep(0.5)
            took = time.time() - started
            time.sleep(3)  # a late pass would still show in the counts
            calls = requests.get(f"{sandbox}/control/calls", timeout=30).json()["calls"]
            succeeded = jobs.filter(status="succeeded").count()
            results.append((name, sum(c["kind"] == "poll" for c in calls) / args.jobs,
                            (received(stack) - messages) / args.jobs, took, succeeded))
            jobs.delete()
    finally:
        stack.stop()

    interval = float(stack.env.get("POLL_INTERVAL_S", settings.POLL_INTERVAL_S))
    fixed = args.render_s / interval
    print(f"{args.jobs} jobs per phase, each a {args.render_s:g} s render; POLL_INTERVAL_S {interval:g}")
    print(f"baseline (a poll and a message every {interval:g} s): {fixed:.0f} polls and {fixed:.0f} messages per job")
    for name, polls, messages, took, succeeded in results:
        print(f"{name:20s} {polls:5.2f} polls/job  {messages:5.2f} messages/job  "
              f"({succeeded}/{args.jobs} succeeded, phase took {took:.1f} s)")
    print("targets: with callbacks <= 4 polls and <= 6 messages per job; without <= 10 polls")
    baseline_is = f"a poll and a message every {interval:g} s (render / POLL_INTERVAL_S, computed)"
    for name, polls, messages, took, succeeded in results:
        callbacks = name != "no callbacks"
        record(f"{name}: polls per job", polls, "polls", baseline=fixed, baseline_is=baseline_is,
               ratio=polls / fixed, target="<= 4" if callbacks else "<= 10",
               met=polls <= 4 if callbacks else polls <= 10)
        record(f"{name}: messages per job", messages, "messages", baseline=fixed, baseline_is=baseline_is,
               ratio=messages / fixed, target="<= 6" if callbacks else None, met=messages <= 6 if callbacks else None)


if __name__ == "__main__":
    main()
