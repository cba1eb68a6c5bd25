"""Every storm seed that once failed, the bug each found and its regression test (which runs in `make
test`). `make chaos-pinned` (python -m tests.chaos.pinned) replays each storm, one after another, and
exits non-zero if any of them fails."""

import subprocess
import sys

PINNED = [
    # (seed, jobs): storms that failed once, the bug each found, and its regression test.
    (70455, 100),  # a cancelled job's render accepted after the cancel stayed running, its money reserved
    #              (tests/executor/test_executor.py, tests/executor/test_money_invariants.py: cancel clean-up)
    (820687, 100),  # a resend of a key answered 429 ended its attempt unpaid, with a charge in the ledger
    #               (tests/executor/test_executor.py::test_a_refused_resend_of_a_key_does_not_end_the_attempt_as_unpaid)
    (1, 60),  # a keyed attempt given up `failed` after its sends' answers were lost (tests/executor/test_executor.py)
    (3, 100),  # a cancelled job's attempt left `submitting`, its money held (tests/executor/test_executor.py,
    #          tests/executor/test_money_invariants.py)
    (41, 500),  # a pass deciding from a stale attempt (tests/executor/test_money_invariants.py)
    (61, 500),  # a keyed render paid twice after a refused resend made it uncertain (tests/executor/test_executor.py)
    (211, 500),  # the webhooks worker stopped for good after connection cuts (tests/e2e/test_crash.py), and an
    #            aimed kill's hold fault queued behind the storm's (tests/sandbox/test_sandbox.py, faults added first)
    (212, 500),  # the same stopped webhooks worker: five events never delivered (tests/e2e/test_crash.py)
]


def main() -> int:
    failed = []
    for seed, jobs in PINNED:
        print(f"== pinned storm CHAOS_SEED={seed} jobs={jobs}", flush=True)
        if subprocess.run([sys.executable, "-m", "tests.chaos", "--seed", str(seed), "--jobs", str(jobs)]).returncode:
            failed.append(seed)
    print(f"pinned storms: {len(PINNED) - len(failed)} of {len(PINNED)} passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
