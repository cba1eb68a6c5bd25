# A job's start in its first transaction (jobs.dispatch.job_start_first) as one SQL function. It runs for
# every job; as statements sent from Python it cost a round trip more and was planned afresh every time (no
# statement is prepared: config/settings.py, server-side binding): 0.17 ms of planning measured, against
# 0.04 ms for the plain UPDATE it replaced. A PL/pgSQL function keeps its statements' plans for the
# connection's life, and works as it is behind a PgBouncer in transaction mode.
#
# The race it closes: two starters of one client's jobs, each reading N-1 jobs holding a slot under a limit
# of N, both starting one. The client's start lock (the advisory lock jobs.dispatch._start_one takes too,
# under the same key) is taken first (a client with no limit takes none: there is nothing to count), and
# the UPDATE after it is a statement of its own, so its snapshot sees every start committed by the lock's
# earlier holders; the lock is held until the caller's transaction commits. In the same UPDATE, for a
# doorbell (`only_choice`): no other client has a queued job, and none of its own client's queued jobs has
# a higher priority (three range probes of the partial index job_queued, as cheap with a deep backlog).
# True: started; false: not (not the only choice, no slot free, or not queued any more), and the caller
# rolls back.
#
# Changing it: a new migration with CREATE OR REPLACE (the release before keeps calling it with these
# arguments while a deploy rolls out).

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION payonce_job_start_first(p_job uuid, p_client uuid, p_only_choice boolean,
                                                   p_default_running integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_limit integer;
BEGIN
    SELECT coalesce(max_running, p_default_running) INTO v_limit FROM jobs_client WHERE id = p_client;
    IF v_limit > 0 THEN  -- no limit, nothing to count: no lock, and no start waits for another
        PERFORM pg_advisory_xact_lock(hashtextextended('payonce.client_starts:' || p_client::text, 0));
    END IF;
    UPDATE jobs_job j
       SET status = 'running', holds_slot = true, started_at = clock_timestamp(), updated_at = now()
     WHERE j.id = p_job AND j.status = 'queued'
       AND (NOT p_only_choice OR (
            NOT EXISTS (SELECT 1 FROM jobs_job q WHERE q.status = 'queued' AND q.client_id < p_client)
        AND NOT EXISTS (SELECT 1 FROM jobs_job q WHERE q.status = 'queued' AND q.client_id > p_client)
        AND NOT EXISTS (SELECT 1 FROM jobs_job q WHERE q.status = 'queued' AND q.client_id = p_client
                         AND q.priority > j.priority)))
       AND (v_limit = 0
            OR (SELECT count(*) FROM jobs_job h WHERE h.client_id = p_client AND h.holds_slot) < v_limit);
    RETURN FOUND;
END
$$
"""

BACKWARD = "DROP FUNCTION IF EXISTS payonce_job_start_first(uuid, uuid, boolean, integer)"

# Every start leaves a dead entry in job_queued (a job's status is indexed, so its update is never HOT),
# and the probes above walk the dead entries of other clients' started jobs until a vacuum removes them.
# Autovacuum's default waits for a fifth of the table to be dead: on a table of every job ever made, that
# is too long for a queue's index. A fiftieth (and at least 10,000 rows) instead.
VACUUM_OFTEN = "ALTER TABLE jobs_job SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 10000)"
VACUUM_DEFAULT = "ALTER TABLE jobs_job RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)"


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_fair_dispatch"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
        migrations.RunSQL(VACUUM_OFTEN, VACUUM_DEFAULT),
    ]
