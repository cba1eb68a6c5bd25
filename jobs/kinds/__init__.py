"""The job kinds, one table: a kind is one module declaring a `Kind` (jobs.engine.workflow) and one line here.
The API (the create serializer, job_as_dict, the output and report views), the engine (jobs.engine.runner,
jobs.engine.tasks, jobs.engine.chain, job_wake) and the operators (operations, timeline, admin, cli) read KINDS; nothing
branches on a kind's name, and nothing registers itself at start-up: what is here is what is imported.

The kinds' steps call jobs.services (mark running, finish), and jobs.services imports jobs.engine.chain (a run's
stages) and jobs.api.serializers (job_as_dict, an event's body), which read this table. So those three read it
at call time (`from jobs.kinds import KINDS` in the function), never at import: the arrow at import time
runs one way, kinds -> services -> chain, serializers. Everything above jobs.services imports it as usual.
"""

from jobs.engine.workflow import Kind
from jobs.kinds import media
from jobs.kinds.report import kind as report

KINDS: dict[str, Kind] = {kind.name: kind for kind in (media.KIND, report.KIND)}
