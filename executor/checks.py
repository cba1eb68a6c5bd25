"""Pre-submit checks (settings.PRE_SUBMIT_CHECKS): callables `check(job, request)` that run just before
every submit, after the attempt's intent is recorded and before anything is spent. A check that says no
raises SubmitRefused: the attempt fails with PRE_SUBMIT_REFUSED and nothing is sent.

`blocked_subjects` is the example the design names ("may this subject still be depicted"): it refuses
a prompt naming a subject listed in BLOCKED_SUBJECTS, read at every submit, because a subject can be
blocked between the job's submission and its provider call.
"""

import os
import re

from executor.render import SubmitRefused


def blocked_subjects(job, request: dict) -> None:
    blocked = [name.strip() for name in os.environ.get("BLOCKED_SUBJECTS", "").split(",") if name.strip()]
    prompt = request.get("prompt", "")
    for name in blocked:
        if re.search(rf"\b{re.escape(name)}\b", prompt, flags=re.IGNORECASE):
            raise SubmitRefused(f"the subject {name!r} may no longer be depicted")
