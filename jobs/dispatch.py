"""Fair dispatch: which queued job starts next (docs/design.md, "Many clients: fair dispatch and limits").

A queued job is started by a message, but not necessarily the job the message names. Every first-stage
message is a doorbell: its worker starts the fairest queued job there is (jobs.engine.tasks), and the named
job when that is the one. So however deep one client's backlog is in the broker, each message it sent
starts whoever's turn it is, and a second client's job waits at most one turn of the rotation, not for
the backlog. The row is the truth and the message a doorbell, as everywhere in the engine: no per-client
queue, and it holds across any number of worker machines.

The order (stride scheduling over the clients with queued work):
1. the highest priority among queued jobs whose client is under its running limit;
2. within it, the client with the lowest `pass` (jobs.models.ClientTurn); a start moves the client's pass on
   by 1/weight, and never leaves it more than one round behind the others (a client back from idle gets
   one round's turns first, its weight's worth, not a run of turns for the time it was away);
3. within the client, its oldest job of that priority, or the message's own job when that is one of them
   (then nothing else need be sent for it).

What it costs when nobody waits on anybody: a message's own job first tries to start in its first
transaction, where it would have been marked running anyway (job_start_first: one statement decides that
it is the only choice and that its client has a slot). Only when it is not the only choice is the
rotation read (job_start), in a transaction of its own.

Counting every message, nothing is stranded: a job created or retried rings once; a start takes one
doorbell; a doorbell finds nothing to start only when nothing may start. A client at its running limit
swallows doorbells, so the starter marks its turn `blocked`, and each slot such a client frees rings once
more (job_release_slot and jobs.services.job_finish). A doorbell lost with a dead worker or a flushed broker
is rung again by the sweeper (jobs.selectors, the stuck jobs).
"""

import logging
import math
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from jobs.engine import chain
from jobs.engine.outcomes import NotStarted
from jobs.models import JobStatus

logger = logging.getLogger(__name__)

QUEUED = JobStatus.QUEUED.value
RING_AGAIN_S = 1.0  # a doorbell that found its choices locked rings again after this (job_start)

# The clients with queued jobs (a skip scan of the partial index job_queued: one probe per client, however
# deep each backlog is), each one's best queued priority, pass, weight, running limit and jobs holding a
# slot.
_CANDIDATES_SQL = f"""
WITH RECURSIVE active(client_id) AS (
    (SELECT client_id FROM jobs_job WHERE status = '{QUEUED}' ORDER BY client_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.client_id FROM jobs_job j WHERE j.status = '{QUEUED}' AND j.client_id > a.client_id
             ORDER BY j.client_id LIMIT 1)
      FROM active a WHERE a.client_id IS NOT NULL
)
SELECT a.client_id, top.priority, t.pass, c.weight, coalesce(c.max_running, %(default_running)s),
       (SELECT count(*) FROM jobs_job h WHERE h.client_id = a.client_id AND h.holds_slot),
       t.last_at
  FROM active a
  JOIN jobs_client c ON c.id = a.client_id
  LEFT JOIN jobs_clientturn t ON t.client_id = a.client_id
 CROSS JOIN LATERAL (SELECT q.priority FROM jobs_job q WHERE q.client_id = a.client_id AND q.status = '{QUEUED}'
                      ORDER BY q.priority DESC, q.created_at LIMIT 1) top
 WHERE a.client_id IS NOT NULL
"""

# The message's own job: its status, client, priority, run and kind; whether it is the only choice there is
# (`alone`: no other client has a queued job, and none of its own client's queued jobs has a higher
# priority; two range probes of job_queued each side of its client, so as cheap with a deep backlog); and
# its client's figures as _CANDIDATES_SQL reads them. Read only when the job did not start in its first
# transaction (job_start_first, the common case, decides the same in one statement without reading this).
_OWN_SQL = f"""
SELECT j.status, j.client_id, j.priority, j.run, j.kind,
       j.status = '{QUEUED}'
       AND NOT EXISTS (SELECT 1 FROM jobs_job q WHERE q.status = '{QUEUED}' AND q.client_id < j.client_id)
       AND NOT EXISTS (SELECT 1 FROM jobs_job q WHERE q.status = '{QUEUED}' AND q.client_id > j.client_id)
       AND NOT EXISTS (SELECT 1 FROM jobs_job q WHERE q.status = '{QUEUED}' AND q.client_id = j.client_id
                        AND q.priority > j.priority),
       t.pass, c.weight, coalesce(c.max_running, %(default_running)s),
       (SELECT count(*) FROM jobs_job h WHERE h.client_id = j.client_id AND h.holds_slot),
       t.last_at
  FROM jobs_job j JOIN jobs_client c ON c.id = j.client_id LEFT JOIN jobs_clientturn t ON t.client_id = j.client_id
 WHERE j.id = %(own)s
"""

# Starts of one client's jobs are taken one at a time: a transaction-scoped advisory lock per client, so
# the running count read next (a statement after the lock: its snapshot sees every start committed by the
# holders before us) cannot be read by two starters at N-1 who then both start. That is the race this lock
# closes. An advisory lock, not the turn row's: a start of a client alone in the queue writes no turn row.
# Its key is `payonce.client_starts:<client id>`, the key payonce_job_start_first takes too (one lock).
_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"

# Under that lock: the running count, and the start itself (queued -> running, holding a slot) of the
# chosen job when the count is under the limit. SKIP LOCKED: a job another starter is taking is not waited
# for. The status condition is re-checked on the row by the UPDATE: a job cancelled meanwhile is not
# started. `started_at` is the moment of the start itself, after the count (not the transaction's start).
# The client's turn moves on by its stride, from the row as it is now (under the lock), and
# never more than one round behind the others (`floor`, null: none).
_START_SQL = f"""
WITH running AS (SELECT count(*) AS n FROM jobs_job WHERE client_id = %(client)s AND holds_slot),
pick AS ({{pick}} FOR UPDATE SKIP LOCKED),
started AS (
    UPDATE jobs_job j SET status = '{JobStatus.RUNNING}', holds_slot = true, started_at = clock_timestamp(),
                          updated_at = now()
      FROM pick
     WHERE j.id = pick.id AND j.status = '{QUEUED}' AND (%(limit)s = 0 OR (SELECT n FROM running) < %(limit)s)
    RETURNING j.id, j.run, j.kind
),
turn AS (
    INSERT INTO jobs_clientturn (client_id, pass, blocked, last_at)
    SELECT %(client)s, round((coalesce(%(floor)s::float8, 0) + %(stride)s::float8)::numeric, 9)::float8, false, now()
     WHERE EXISTS (SELECT 1 FROM started)
    ON CONFLICT (client_id) DO UPDATE
       SET pass = round((greatest(coalesce(jobs_clientturn.pass, %(floor)s::float8, 0),
                                  coalesce(%(floor)s::float8, '-infinity'::float8)) + %(stride)s::float8)::numeric, 9)::float8,
           last_at = now(), blocked = jobs_clientturn.blocked AND %(limit)s > 0
    RETURNING pass
)
SELECT (SELECT n FROM running), started.id, started.run, started.kind, (SELECT pass FROM turn)
  FROM (SELECT 1) one
  LEFT JOIN started ON true
"""
_PICK_OWN = f"SELECT id FROM jobs_job WHERE id = %(own)s AND status = '{QUEUED}'"
_PICK_NEXT = (f"SELECT id FROM jobs_job WHERE client_id = %(client)s AND status = '{QUEUED}' AND priority = %(priority)s"
              f" ORDER BY priority DESC, created_at LIMIT 1")


@dataclass(frozen=True)
class Start:
    """A job to run from its first stage: `claimed` when this call started it (queued -> running), False when
    the message's own job was running already (a first stage sent again: run it as named)."""

    job_id: str
    run: int
    kind: str
    claimed: bool


@dataclass
class _Candidate:
    client_id: object
    priority: int
    pass_value: float | None
    weight: int
    limit: int
    running: int
    last_at: object

    def has_slot(self) -> bool:
        return self.limit == 0 or self.running < self.limit

    def order(self):
        # Highest priority first; then the lowest pass (a client new to the rotation first); then the one
        # that started least recently.
        return (-self.priority, -math.inf if self.pass_value is None else self.pass_value,
                self.last_at is not None, self.last_at or 0)


def job_start(*, own=None, doorbell: bool = True) -> Start | None:
    """Start the fairest queued job, the message's own job (`own`) when it is that one; None when nothing
    may start now. Asked when the message's own job did not start in its first transaction
    (job_start_first), and by a doorbell with no job of its own.

    `doorbell`: the message was rung for a job created or retried, or by the sweeper for a queued job whose
    doorbell was lost (one per such job: the count above). Its own job already started by another
    doorbell, it starts the next one. Without it, the message names the job to run (a first stage sent
    again after a back-off, a resume, a test stepping one job through): a running one runs as named, a
    queued one starts now if its client has a free slot, whoever's turn it is."""
    params = {"default_running": settings.CLIENT_MAX_RUNNING, "own": own}
    own_row, alone, skipped = None, False, False
    with connection.cursor() as cursor:
        if own is not None:
            cursor.execute(_OWN_SQL, params)
            row = cursor.fetchone()
            if row is not None and row[0] != QUEUED:
                if not doorbell:  # the runner decides what is left (a job that ended stops there)
                    return Start(str(own), row[3], row[4], claimed=False)
            elif row is not None:
                own_row, alone = row[:5], row[5]
                own_candidate = _Candidate(row[1], row[2], *row[6:])
            elif not doorbell:
                return None
        if own_row is not None and (alone or not doorbell):
            # The only choice there is (or the job the message names): started now if its client has a slot
            # free when read (and again under the lock); else passed over.
            if own_candidate.has_slot():
                started, running = _start_one(own_candidate, [], own)
                if started is not None:
                    return started
                if running is not None and own_candidate.limit and running >= own_candidate.limit:
                    own_candidate.running = running  # filled meanwhile
            if not own_candidate.has_slot():
                mark_blocked([own_candidate.client_id])
                return None
            if not doorbell:
                return None  # another starter took it (and runs it), or it was cancelled
            own_row = None  # a doorbell whose job another took: it starts the fairest job instead
            skipped = True
        cursor.execute(_CANDIDATES_SQL, params)
        candidates = [_Candidate(*row) for row in cursor.fetchall()]
    passed_over = []
    while candidates:
        ready = [c for c in candidates if c.has_slot()]
        passed_over += [c.client_id for c in candidates if c not in ready]
        if not ready:
            break
        chosen = min(ready, key=_Candidate.order)
        mine = own_row is not None and own_row[1] == chosen.client_id and own_row[2] == chosen.priority
        started, running = _start_one(chosen, candidates, own if mine else None)
        if started is not None:
            mark_blocked(passed_over)
            return started
        if running is not None and chosen.limit and running >= chosen.limit:
            chosen.running = running  # filled meanwhile: passed over, and marked for its next free slot
            continue
        if mine:
            own_row = None  # another starter took it: the client's next job instead
            continue
        candidates.remove(chosen)  # its queued jobs are all being started by others
        skipped = True
    mark_blocked(passed_over)
    if skipped and doorbell:
        # A queued job passed over because its row was locked is taken to be starting elsewhere; should the
        # lock's holder not start it after all (its transaction rolled back, or it only touched the row),
        # this doorbell would be lost with it. So it rings once more, a moment later: at worst a spare
        # doorbell, which starts nothing.
        chain.ring(countdown=RING_AGAIN_S)
    return None


# The start in the job's first transaction (job_start_first), the common case: the job is the only choice
# there is (no other client has a queued job, and none of its own client's queued jobs has a higher
# priority), or the message names it (`only_choice` false), and its client is under its running limit. One
# call of an SQL function (jobs/migrations/0012_fair_dispatch_first_start.py, where the statements and the
# race they close are) that takes the client's start lock (_LOCK_SQL's) and decides the start in one
# statement after it: nothing of the rotation is read, no turn row is written (a pass matters only beside
# other clients', and _start_one's clamp lifts it when they come), and its plans are kept for the connection.
_START_FIRST_SQL = "SELECT payonce_job_start_first(%s, %s, %s, %s)"


def job_start_first(*, job_id, client_id, only_choice: bool) -> None:
    """queued -> running, holding a slot of its client's running limit, in the caller's transaction (the
    job's first), which then holds the client's start lock until it commits. `only_choice`: only if no other
    job is fairer (a doorbell). NotStarted when it did not start (not the only choice, no slot free, or not
    queued any more): the caller's transaction rolls back, and job_start decides."""
    with connection.cursor() as cursor:
        cursor.execute(_START_FIRST_SQL, [job_id, client_id, only_choice, settings.CLIENT_MAX_RUNNING])
        if not cursor.fetchone()[0]:
            raise NotStarted()


def _start_one(chosen: _Candidate, candidates: list[_Candidate], own) -> tuple[Start | None, int | None]:
    """Under the client's start lock: start its job and move its turn on, or say its running count (None: no
    job was free). (A client alone in the queue starts in its job's first transaction instead, with no turn
    written: a pass matters only beside others', and the clamp below lifts it when others come.)"""
    # Never more than one round (1: a weight-1 client's stride) behind the other clients with work: a
    # client back from idle (or new) takes one round's turns first (its weight's worth), not a run of
    # them for the time it was away. Rounded, so that three strides of 1/3 make exactly 1 (a tie, then
    # decided by who started least recently) rather than a hair less.
    others = [c.pass_value for c in candidates if c is not chosen and c.pass_value is not None]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_LOCK_SQL, [f"payonce.client_starts:{chosen.client_id}"])
        sql = _START_SQL.replace("{pick}", _PICK_OWN if own is not None else _PICK_NEXT)
        cursor.execute(sql, {"client": chosen.client_id, "limit": chosen.limit, "own": own, "priority": chosen.priority,
                             "floor": (min(others) - 1.0) if others else None, "stride": 1.0 / max(chosen.weight, 1)})
        running, job_id, run, kind, new_pass = cursor.fetchone()
    if job_id is None:
        return None, running
    if new_pass is not None:
        chosen.pass_value = new_pass
    return Start(str(job_id), run, kind, claimed=True), running


def mark_blocked(client_ids: list) -> None:
    """These clients were passed over at their running limit: the next slot each frees rings for it."""
    if client_ids:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE jobs_clientturn SET blocked = true WHERE client_id = ANY(%s) AND NOT blocked",
                           [list(set(client_ids))])
            # A client passed over before its first start has no turn row yet: it gets one, blocked.
            cursor.execute("INSERT INTO jobs_clientturn (client_id, pass, blocked, last_at)"
                           " SELECT unnest(%s::uuid[]), NULL, true, NULL ON CONFLICT (client_id) DO NOTHING",
                           [list(set(client_ids))])


def client_unblock(*, client_id) -> None:
    """A doorbell rung for a blocked client's free slot found none of its jobs queued: stop ringing for it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE jobs_clientturn SET blocked = false WHERE client_id = %s AND blocked"
            f" AND NOT EXISTS (SELECT 1 FROM jobs_job WHERE client_id = %s AND status = '{QUEUED}')",
            [client_id, client_id])


def job_release_slot(*, job_id):
    """The job stops counting against its client's running limit (it waits on its provider now). Its client's
    id when that client was passed over at the limit (the caller rings for its next job), else None."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_job SET holds_slot = false WHERE id = %s AND holds_slot"
            " RETURNING client_id, (SELECT t.blocked FROM jobs_clientturn t WHERE t.client_id = jobs_job.client_id)",
            [job_id])
        row = cursor.fetchone()
    return row[0] if row and row[1] else None
