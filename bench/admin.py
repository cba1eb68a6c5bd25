"""Benchmark: the operators' admin pages on 1,000,000 attempt rows (issue 14: the job list and a job page
answer in under 500 ms).

    load      its own database `payonce_bench_admin`, kept between runs: 50 clients, 300,000 jobs over the
              last 14 months (media and report; most succeeded, some failed, waiting, cancelled, running),
              1,000,000 attempts (upstream keys payonce-{job}-{n}), their steps, reservations, budget
              months, webhook deliveries with their tries (some dead), reports, a few orders, and one heavy
              job (2,000 attempts, 2,000 delivery tries). Made in SQL (INSERT ... SELECT generate_series),
              then VACUUM ANALYZE. A marker table says the rows are there; `--rebuild` drops and remakes it.
    pages     every page in PAGES, requested in-process through Django's test Client (the whole middleware
              stack, logged in as a superuser with force_login; no HTTP socket), once to warm and then
              `--repeats` times: p50 and max in ms, and the SQL statements of one more request, checked for
              a COUNT(*) over the whole jobs or attempts table (the script fails if a page runs one, or
              answers anything but 200).
    baseline  the same job list and job pages served by Django's stock ModelAdmin (same columns, filters
              and search fields, date_hierarchy for the month, stock tabular inlines for steps, attempts
              and deliveries) on an AdminSite of its own, built here, in the same run.

Run: `.venv/bin/python bench/admin.py [--rebuild] [--repeats 7] [--only PAGE,PAGE] [--no-baseline]`.
"""

import argparse
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

# Every page timed, with its query parameters: the one place to change when an admin URL or a filter's
# parameter is renamed (the names below are operators.admin.jobs's, operators.admin.webhooks's and operators.admin.billing's). `{...}` are
# filled from the data set (dataset_samples). `kind`: "list" and "job" pages are held to the 500 ms;
# "other" ones are timed, recorded and held to the same mark; "extra" ones are only printed.
PAGES = {
    "job list": {"kind": "list", "path": "/admin/jobs/job/", "params": {}},
    "by status (failed)": {"kind": "list", "path": "/admin/jobs/job/", "params": {"status__exact": "failed"}},
    "by client (the largest)": {"kind": "list", "path": "/admin/jobs/job/", "params": {"client__id__exact": "{client}"}},
    "by kind (report)": {"kind": "list", "path": "/admin/jobs/job/", "params": {"kind__exact": "report"}},
    "by model": {"kind": "list", "path": "/admin/jobs/job/", "params": {"model": "sandbox/video-keyed"}},
    "by month": {"kind": "list", "path": "/admin/jobs/job/", "params": {"month": "{month}"}},
    "search: job id": {"kind": "list", "path": "/admin/jobs/job/", "params": {"q": "{job}"}},
    "search: upstream key": {"kind": "list", "path": "/admin/jobs/job/", "params": {"q": "payonce-{job}-2"}},
    "search: idempotency key": {"kind": "list", "path": "/admin/jobs/job/", "params": {"q": "{idempotency_key}"}},
    "search: metadata": {"kind": "list", "path": "/admin/jobs/job/", "params": {"q": "customer=c7"}},
    "job page (media, 3 attempts)": {"kind": "job", "path": "/admin/jobs/job/{job}/change/", "params": {}},
    "job page (report, 12 chapters)": {"kind": "job", "path": "/admin/jobs/job/{report}/change/", "params": {}},
    "job page (heavy: 2,000 attempts)": {"kind": "job", "path": "/admin/jobs/job/{heavy}/change/", "params": {}},
    "spend": {"kind": "other", "path": "/admin/billing/spend/", "params": {}},
    "spend, the largest client": {"kind": "other", "path": "/admin/billing/spend/",
                                  "params": {"client": "{client}"}},
    "dead letters": {"kind": "other", "path": "/admin/webhooks/deadletter/", "params": {}},
    # A bulk action's confirmation over every job the list's filter matches (operators.admin.jobs.JobAdmin.bulk_view).
    "bulk preview: retry every failed job": {"kind": "other", "path": "/admin/jobs/job/bulk/retry/",
                                             "params": {"status__exact": "failed"}},
    "bulk preview: replay a month": {"kind": "other", "path": "/admin/jobs/job/bulk/replay/",
                                     "params": {"month": "{month}"}},
    # Every entry of the heavy job's timeline, not only the newest (operators.timeline.SHOWN): asked for by hand.
    "heavy job page, every entry": {"kind": "extra", "path": "/admin/jobs/job/{heavy}/change/", "params": {"all": "1"}},
}

# The same pages the stock way, where the stock admin has a way (no filter by model, no metadata key=value).
BASELINE = {
    "job list": {"path": "/baseline/jobs/job/", "params": {}},
    "by status (failed)": {"path": "/baseline/jobs/job/", "params": {"status__exact": "failed"}},
    "by client (the largest)": {"path": "/baseline/jobs/job/", "params": {"client__id__exact": "{client}"}},
    "by kind (report)": {"path": "/baseline/jobs/job/", "params": {"kind__exact": "report"}},
    "by month": {"path": "/baseline/jobs/job/", "params": {"created_at__year": "{month_year}",
                                                          "created_at__month": "{month_month}"}},
    "search: job id": {"path": "/baseline/jobs/job/", "params": {"q": "{job}"}},
    "search: upstream key": {"path": "/baseline/jobs/job/", "params": {"q": "payonce-{job}-2"}},
    "search: idempotency key": {"path": "/baseline/jobs/job/", "params": {"q": "{idempotency_key}"}},
    # Stock search is icontains over the JSON text: "c7" also matches c70..c79.
    "search: metadata": {"path": "/baseline/jobs/job/", "params": {"q": "c7"}},
    "job page (media, 3 attempts)": {"path": "/baseline/jobs/job/{job}/change/", "params": {}},
    "job page (report, 12 chapters)": {"path": "/baseline/jobs/job/{report}/change/", "params": {}},
    "job page (heavy: 2,000 attempts)": {"path": "/baseline/jobs/job/{heavy}/change/", "params": {}},
}

DATABASE_URL = "postgres://localhost:5432/payonce_bench_admin"
DATABASE_NAME = "payonce_bench_admin"
# Bump when the generator changes: a database made by another version is dropped and made again.
DATASET_VERSION = "1"
JOBS = 300_000  # the heavy job included
ATTEMPTS = 1_000_000  # exactly: the generator tops up to it
CLIENTS = 50
HEAVY_RUNS, HEAVY_ATTEMPTS_PER_RUN, HEAVY_TRIES_PER_DELIVERY = 100, 20, 20
TARGET_MS = 500.0
SUPERUSER = "bench-admin"
WHOLE_TABLES = ("jobs_job", "executor_attempt")

# --- the data set ---------------------------------------------------------------------------------------------
# Each statement runs in one session (the plan is a temporary table), in order; the comments say which
# model constraint a line keeps. Job timestamps are relative to now(), so the months filtered exist.

LOAD = [
    ("clients", """
INSERT INTO jobs_client (id, name, monthly_cap_usd, created_at)
SELECT gen_random_uuid(), format('bench-admin client %%s', lpad(g::text, 2, '0')), NULL, now() - interval '15 months'
  FROM generate_series(1, %(clients)s) g;
CREATE TEMP TABLE bench_clients AS
SELECT row_number() OVER (ORDER BY name)::int AS n, id FROM jobs_client WHERE name LIKE 'bench-admin client %%';
INSERT INTO webhooks_endpoint (client_id, url, created_at, disabled_at, disabled_reason)
SELECT id, format('https://hooks.example.com/c%%s', n), now() - interval '15 months', NULL, '' FROM bench_clients;
INSERT INTO webhooks_signingsecret (endpoint_id, secret, created_at, expires_at)
SELECT id, 'whsec_' || encode(decode(md5(random()::text) || md5(random()::text), 'hex'), 'base64'), created_at, NULL
  FROM webhooks_endpoint;
"""),
    # One row per job with every random choice made once, so attempts, steps and deliveries agree.
    ("plan", """
SELECT setseed(0.14);
CREATE TEMP TABLE plan AS
WITH b AS (
    SELECT g AS rn,
           1 + floor(%(clients)s * random() ^ 2)::int AS client_n,  -- a few big clients, many small ones
           CASE WHEN random() < 0.15 THEN 'report' ELSE 'media' END AS kind,
           random() AS r_status, random() AS r_time, random() AS r_chain, random() AS r_n, random() AS r_x,
           random() AS r_run, 1 + floor(random() * 500)::int AS customer_n, 1 + floor(random() * 40)::int AS campaign_n
      FROM generate_series(1, %(jobs)s - 1) g
), s AS (
    SELECT b.*,
           CASE WHEN r_status < 0.84 THEN 'succeeded' WHEN r_status < 0.92 THEN 'failed'
                WHEN r_status < 0.945 THEN 'cancelled' WHEN r_status < 0.965 THEN 'waiting'
                WHEN r_status < 0.99 THEN 'running' ELSE 'queued' END AS status,
           CASE WHEN kind = 'report' THEN 8 + floor(r_n * 8)::int ELSE 0 END AS chapters
      FROM b
)
SELECT s.rn, gen_random_uuid() AS id, c.id AS client_id, s.client_n, s.kind, s.status, s.chapters,
       s.customer_n, s.campaign_n, s.r_x, s.r_run, false AS heavy, 1 AS run,
       CASE WHEN s.kind = 'report' THEN '["sandbox/llm"]'
            WHEN s.r_chain < 0.5 THEN '["sandbox/video-keyed"]'
            WHEN s.r_chain < 0.75 THEN '["sandbox/video-keyed", "sandbox/image-lookup"]'
            WHEN s.r_chain < 0.9 THEN '["sandbox/image-lookup"]'
            ELSE '["sandbox/image-blind", "sandbox/image-lookup"]' END::jsonb AS chain,
       CASE WHEN s.status IN ('running', 'queued') THEN now() - s.r_time * interval '2 hours'
            WHEN s.status = 'waiting' THEN now() - interval '2 hours' - s.r_time * interval '30 days'
            ELSE now() - interval '2 hours' - s.r_time * interval '425 days' END AS created_at,
       CASE WHEN s.kind = 'media' THEN
                CASE s.status
                    WHEN 'succeeded' THEN 1 + (s.r_x < 0.25)::int + (s.r_x < 0.08)::int + (s.r_x < 0.02)::int
                    WHEN 'failed' THEN 1 + floor(s.r_x * 5)::int
                    WHEN 'cancelled' THEN (s.r_x < 0.5)::int
                    WHEN 'waiting' THEN 1 + floor(s.r_x * 3)::int
                    WHEN 'running' THEN 1 + (s.r_x < 0.3)::int
                    ELSE 0 END
            ELSE  -- a report: the synthesis, then one attempt per chapter, then retries of the first chapters
                CASE s.status
                    WHEN 'succeeded' THEN 1 + s.chapters + floor(s.r_x * 2)::int
                    WHEN 'failed' THEN 1 + s.chapters + floor(s.r_x * 3)::int
                    WHEN 'cancelled' THEN 1 + floor(s.r_x * s.chapters)::int
                    WHEN 'waiting' THEN 1 + s.chapters
                    WHEN 'running' THEN 2 + floor(s.r_x * (s.chapters - 1))::int
                    ELSE 0 END
       END AS n_attempts
  FROM s JOIN bench_clients c ON c.n = s.client_n;
"""),
    # Exactly ATTEMPTS in all: the deficit is one more earlier (failed) try on that many succeeded media jobs.
    ("plan: top up to the attempt count", """
UPDATE plan SET n_attempts = n_attempts + 1
 WHERE rn IN (SELECT rn FROM plan WHERE kind = 'media' AND status = 'succeeded' ORDER BY rn
               LIMIT greatest(0, %(attempts)s - %(heavy_attempts)s - (SELECT sum(n_attempts) FROM plan)));
-- A person's retry (run 2) of a few media jobs: the first half of their attempts belong to run 1.
UPDATE plan SET run = 2 WHERE kind = 'media' AND status IN ('succeeded', 'failed') AND n_attempts >= 2 AND r_run < 0.1;
INSERT INTO plan (rn, id, client_id, client_n, kind, status, chapters, customer_n, campaign_n, r_x, r_run, heavy, run,
                  chain, created_at, n_attempts)
SELECT 0, gen_random_uuid(), id, 1, 'media', 'succeeded', 0, 7, 1, 0.5, 0.5, true, %(heavy_runs)s,
       '["sandbox/video-keyed", "sandbox/image-lookup"]', now() - interval '40 days', %(heavy_attempts)s
  FROM bench_clients WHERE n = 1;
CREATE UNIQUE INDEX ON plan (id);
ANALYZE plan;
"""),
    ("jobs", """
INSERT INTO jobs_job (id, client_id, idempotency_key, request_hash, kind, status, run, model_chain, input, policy,
                      output_key, webhook_url, metadata, output, error, created_at, started_at, completed_at,
                      updated_at, lease_until)
SELECT p.id, p.client_id,
       format('order-%%s-%%s', p.rn, substr(md5(p.rn::text), 1, 8)),  -- job_client_idempotency_key: unique
       md5(p.id::text) || md5(p.rn::text),
       p.kind, p.status, p.run, p.chain,
       CASE WHEN p.kind = 'media' THEN jsonb_build_object('prompt', format('bench render %%s', p.rn),
                                                         'params', jsonb_build_object('render_s', 2))
            ELSE jsonb_build_object('chapters', (SELECT jsonb_agg('ch' || lpad(i::text, 2, '0') ORDER BY i)
                                                   FROM generate_series(1, p.chapters) i),
                                    'subject', jsonb_build_object('name', format('reader %%s', p.rn))) END,
       '{}'::jsonb,
       format('renders/%%s.%%s', p.id, CASE WHEN p.kind = 'media' THEN 'mp4' ELSE 'md' END),  -- job_client_output_key
       CASE WHEN p.r_run > 0.9 THEN format('https://hooks.example.com/c%%s/job', p.client_n) ELSE '' END,
       jsonb_build_object('customer', 'c' || p.customer_n, 'campaign', 'campaign-' || p.campaign_n),
       CASE WHEN p.status <> 'succeeded' THEN NULL
            WHEN p.kind = 'media' THEN jsonb_build_object(
                'key', format('renders/%%s.mp4', p.id), 'url', format('http://127.0.0.1:8000/v1/jobs/%%s/output', p.id),
                'written_by', p.id::text, 'content_type', 'video/mp4', 'bytes', 4096)
            ELSE jsonb_build_object('report', format('http://127.0.0.1:8000/v1/jobs/%%s/report', p.id),
                                    'link', format('http://127.0.0.1:8000/r/%%s', md5(p.id::text)), 'delivered', true) END,
       CASE p.status
            WHEN 'failed' THEN jsonb_build_object('code', 'PROVIDER_REFUSED', 'message', 'The provider refused the request.')
            WHEN 'waiting' THEN jsonb_build_object('code', 'NEEDS_REVIEW',
                                                   'message', 'An attempt may or may not have been accepted: a person decides.')
            WHEN 'cancelled' THEN jsonb_build_object('code', 'CANCELLED', 'message', 'Cancelled by the client.')
            ELSE NULL END,
       p.created_at,
       CASE WHEN p.status = 'queued' THEN NULL ELSE p.created_at + interval '100 ms' END,
       CASE WHEN p.status IN ('succeeded', 'failed', 'cancelled')
            THEN p.created_at + p.n_attempts * interval '40 seconds' + interval '20 seconds' END,
       p.created_at + p.n_attempts * interval '40 seconds' + interval '20 seconds',
       p.created_at + interval '5 minutes'
  FROM plan p;
"""),
    # One attempt per number (attempt_job_number); only the job's last attempt may be out (running), so
    # at most one per (job, run, step) is (attempt_one_out_per_run). A report's attempt 1 is the synthesis,
    # attempt m >= 2 is chapter ((m - 2) mod C) + 1: the later ones are retries of the first chapters.
    ("attempts", """
WITH a AS (
    SELECT p.id AS job_id, p.kind, p.status, p.chapters, p.n_attempts, p.heavy, p.rn, m,
           CASE WHEN p.heavy THEN (m - 1) / %(heavy_per_run)s + 1
                WHEN p.run = 2 AND m > p.n_attempts / 2.0 THEN 2 ELSE 1 END AS run,
           CASE WHEN p.kind = 'media' THEN 'submit' WHEN m = 1 THEN 'synthesis'
                ELSE 'chapter-ch' || lpad((((m - 2) %% p.chapters) + 1)::text, 2, '0') END AS step,
           CASE WHEN p.kind = 'media' THEN m = p.n_attempts ELSE m = 1 OR m + p.chapters > p.n_attempts END AS last_for_step,
           m = p.n_attempts AS final,
           split_part(p.chain ->> least(m - 1, jsonb_array_length(p.chain) - 1), '/', 2) AS model,
           p.created_at + (m - 1) * interval '40 seconds' + interval '1 second' AS created_at0,
           random() AS r1, random() AS r2, 800 + floor(random() * 600)::int AS tokens_in,
           150 + floor(random() * 250)::int AS tokens_out, 300 + floor(random() * 4000)::int AS duration_ms
      FROM plan p CROSS JOIN LATERAL generate_series(1, p.n_attempts) AS m
), s AS (
    SELECT a.*, least(now(), created_at0 + (run - 1) * interval '1 hour') AS created_at,
           CASE WHEN NOT last_for_step THEN 'failed'
                WHEN NOT final THEN 'succeeded'
                WHEN status = 'succeeded' THEN 'succeeded'
                WHEN status IN ('failed', 'cancelled') THEN 'failed'
                WHEN status = 'waiting' THEN CASE WHEN r1 < 0.6 THEN 'uncertain' ELSE 'failed' END
                ELSE 'running' END AS state
      FROM a
), e AS (
    SELECT s.*,
           CASE WHEN state = 'failed' AND NOT last_for_step
                    THEN (ARRAY['rate_limited', 'timeout', 'server_error', 'network', 'unavailable', 'rate_limited'])[1 + floor(r2 * 6)::int]
                WHEN state = 'failed' AND status = 'cancelled' THEN 'cancelled'
                WHEN state = 'failed' THEN (ARRAY['refused', 'invalid_input', 'window_expired', 'server_error', 'budget_exceeded'])[1 + floor(r2 * 5)::int]
                WHEN state = 'uncertain' THEN CASE WHEN r2 < 0.5 THEN 'timeout' ELSE 'network' END
           END AS error_class,
           -- 1%% of succeeded media renders were never priced by the provider: the spend pages count them.
           CASE WHEN state = 'succeeded' AND model <> 'llm' AND r2 < 0.01 THEN NULL
                WHEN state = 'succeeded' AND model = 'video-keyed' THEN 0.400000
                WHEN state = 'succeeded' AND model = 'llm' THEN round((tokens_in * 3 + tokens_out * 15) / 1000000.0, 6)
                WHEN state = 'succeeded' THEN 0.040000
                WHEN state = 'failed' THEN 0
           END AS cost,
           CASE model WHEN 'video-keyed' THEN 0.400000 WHEN 'llm' THEN 0.020000 ELSE 0.040000 END AS worst_case
      FROM s
)
INSERT INTO executor_attempt (job_id, run, step, number, provider, model, upstream_key, upstream_id, state, error_class,
                              error, request, sends, last_status, poll_errors, answer, usage, cost_usd, cost_source,
                              created_at, submitted_at, accepted_at, expected_s, finished_at, retry_at, duration_ms)
SELECT job_id, run, step, m, 'sandbox', model, format('payonce-%%s-%%s', job_id, m),
       CASE WHEN error_class IN ('rate_limited', 'refused', 'invalid_input', 'budget_exceeded') THEN ''
            ELSE 'gen_' || substr(md5(job_id::text || m), 1, 20) END,
       state, error_class,
       CASE error_class
            WHEN 'rate_limited' THEN 'HTTP 429: {"error": "rate limit exceeded", "retry_after": 2}'
            WHEN 'timeout' THEN 'no answer within 30.0 s (read timeout)'
            WHEN 'server_error' THEN 'HTTP 500: {"error": "internal error", "request_id": "req_' || substr(md5(job_id::text), 1, 12) || '"}'
            WHEN 'network' THEN 'ConnectionResetError: [Errno 104] Connection reset by peer'
            WHEN 'unavailable' THEN 'HTTP 503: {"error": "model overloaded, try again later"}'
            WHEN 'refused' THEN 'HTTP 400: {"error": "content policy: the prompt was refused"}'
            WHEN 'invalid_input' THEN 'HTTP 422: {"error": "params.render_s must be <= 600"}'
            WHEN 'window_expired' THEN 'the generation did not finish inside its deadline (900 s)'
            WHEN 'budget_exceeded' THEN 'the month''s budget has no room for this attempt''s worst case'
            WHEN 'cancelled' THEN 'the job was cancelled'
       END,
       CASE WHEN kind = 'media' THEN jsonb_build_object('prompt', format('bench render %%s', rn), 'render_s', 2)
            ELSE jsonb_build_object('max_tokens', 600, 'messages', 2) END,
       1,
       CASE WHEN state IN ('succeeded', 'running') THEN 200
            WHEN state = 'uncertain' THEN NULL
            ELSE CASE error_class WHEN 'rate_limited' THEN 429 WHEN 'server_error' THEN 500 WHEN 'unavailable' THEN 503
                                  WHEN 'refused' THEN 400 WHEN 'invalid_input' THEN 422 ELSE NULL END END,
       0,
       CASE WHEN model = 'llm' AND state = 'succeeded' THEN format('Chapter text of %%s, written for the bench.', step) END,
       CASE WHEN state <> 'succeeded' THEN NULL
            WHEN model = 'llm' THEN jsonb_build_object('input_tokens', tokens_in, 'output_tokens', tokens_out)
            ELSE '{"units": 1}'::jsonb END,
       cost,
       CASE WHEN cost IS NULL THEN NULL WHEN model = 'llm' THEN 'derived' ELSE 'quoted' END,
       created_at, created_at,
       CASE WHEN state IN ('succeeded', 'running') OR error_class IN ('window_expired', 'server_error')
            THEN created_at + interval '200 ms' END,
       CASE WHEN model = 'llm' THEN NULL ELSE 2.0 END,
       CASE WHEN state IN ('succeeded', 'failed') THEN created_at + duration_ms * interval '1 ms' END,
       CASE WHEN state = 'failed' AND NOT last_for_step THEN created_at + interval '30 seconds' END,
       CASE WHEN state IN ('succeeded', 'failed') THEN duration_ms END
  FROM e;
"""),
    # Each run's steps as the recipes name them (jobs.kinds), as far as the job's status got: the last
    # one failed or still running under a lease. One row per (job, run, name): step_job_run_name.
    ("steps", """
WITH r AS (
    -- The job's final run, and the ended earlier runs (run 2 jobs' first run; every heavy run but the last).
    SELECT p.*, p.run AS step_run, p.status AS run_status FROM plan p WHERE p.status <> 'queued'
    UNION ALL
    SELECT p.*, g, 'failed' FROM plan p CROSS JOIN LATERAL generate_series(1, p.run - 1) g WHERE p.run > 1
), k AS (
    SELECT r.*,
           CASE WHEN kind = 'media' THEN
                    CASE run_status WHEN 'succeeded' THEN 6 WHEN 'failed' THEN 4 WHEN 'cancelled' THEN 2
                                    WHEN 'waiting' THEN 3 ELSE 4 END
                ELSE
                    CASE run_status WHEN 'succeeded' THEN 9 + chapters WHEN 'failed' THEN 7 + chapters
                                    WHEN 'cancelled' THEN 4 ELSE 4 + chapters END
           END AS steps,
           CASE run_status WHEN 'succeeded' THEN 'done' WHEN 'cancelled' THEN 'done' WHEN 'running' THEN 'running'
                           ELSE 'failed' END AS last_status,
           created_at + (step_run - 1) * interval '1 hour' AS run_at
      FROM r
)
INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until, started_at, finished_at)
SELECT k.id, k.step_run,
       CASE WHEN kind = 'media' THEN (ARRAY['check_output', 'mark_running', 'submit', 'wait', 'store_output', 'finish'])[i]
            WHEN i <= 4 THEN (ARRAY['mark_running', 'load', 'synthesis', 'preflight'])[i]
            WHEN i <= 4 + chapters THEN 'chapter-ch' || lpad((i - 4)::text, 2, '0')
            ELSE (ARRAY['chapter:joined', 'seal', 'verdict', 'deliver', 'finish'])[i - 4 - chapters] END,
       CASE WHEN i < steps THEN 'done' ELSE last_status END,
       CASE WHEN i < steps OR last_status = 'done' THEN '{}'::jsonb
            WHEN last_status = 'failed' THEN '{"code": "PROVIDER_REFUSED", "message": "The provider refused the request."}'::jsonb END,
       CASE WHEN r_x < 0.01 THEN 2 ELSE 1 END,  -- a lease taken over now and then
       format('worker-%%s@bench-host-%%s:%%s', 1 + rn %% 16, 1 + rn %% 3, 1000 + rn %% 97),
       run_at + i * interval '3 seconds' + interval '60 seconds',
       run_at + i * interval '3 seconds',
       CASE WHEN i < steps OR last_status <> 'running' THEN run_at + i * interval '3 seconds' + interval '2 seconds' END
  FROM k CROSS JOIN LATERAL generate_series(1, k.steps) AS i;
"""),
    ("reports", """
INSERT INTO jobs_report (job_id, subject, email, figures, chapter_keys, synthesis, sealed_at, delivered_at,
                         delivery_error, purged_at, created_at)
SELECT p.id, jsonb_build_object('name', format('reader %%s', p.rn)), format('reader%%s@example.com', p.rn),
       '{"pages": 12}'::jsonb,
       (SELECT jsonb_agg('ch' || lpad(i::text, 2, '0') ORDER BY i) FROM generate_series(1, p.chapters) i),
       CASE WHEN p.n_attempts >= 1 THEN 'The synthesis every chapter reads.' END,
       CASE WHEN p.status = 'succeeded' THEN p.created_at + interval '10 minutes' END,
       CASE WHEN p.status = 'succeeded' THEN p.created_at + interval '11 minutes' END,
       '', NULL, p.created_at
  FROM plan p WHERE p.kind = 'report';
INSERT INTO jobs_reportchapter (report_id, key, position, status, text, error, run, attempt, done_at)
SELECT p.id, 'ch' || lpad(i::text, 2, '0'), i - 1, st,
       CASE WHEN st = 'done' THEN 'Chapter text, written for the bench.' END,
       CASE WHEN st = 'failed' THEN 'CHAPTER_FAILED: the provider refused the request' ELSE '' END,
       CASE WHEN st = 'pending' THEN NULL ELSE 1 END,
       CASE WHEN st = 'pending' THEN NULL ELSE i + 1 + p.chapters * ((p.n_attempts - i - 1) / p.chapters) END,
       CASE WHEN st = 'done' THEN p.created_at + interval '5 minutes' END
  FROM plan p CROSS JOIN LATERAL generate_series(1, p.chapters) AS i
  CROSS JOIN LATERAL (SELECT CASE WHEN p.status = 'succeeded' THEN 'done'
                                  WHEN p.status = 'failed' THEN CASE WHEN i = p.chapters THEN 'failed' ELSE 'done' END
                                  WHEN i + 1 < p.n_attempts THEN 'done' ELSE 'pending' END AS st) c
 WHERE p.kind = 'report';
"""),
    # Budget months first: a reservation takes its budget_id from the month (client, UTC month of the job).
    ("budget months and reservations", """
INSERT INTO billing_budgetmonth (client_id, month, spent, reserved)
SELECT DISTINCT client_id, date_trunc('month', created_at AT TIME ZONE 'UTC')::date, 0, 0 FROM plan;
-- A report's fan-out pool: what its chapters drew from; released (empty) once the report ended.
INSERT INTO billing_reservation (key, budget_id, job_id, kind, model, amount, state, spent, unpriced, folded,
                                 created_at, resolved_at, parent_id)
SELECT format('fanout-%%s-1', p.id), b.id, p.id, 'fanout', 'sandbox/llm',
       CASE WHEN p.status = 'running' THEN 0.02 * (p.chapters + 1 - p.n_attempts) ELSE 0 END,
       CASE WHEN p.status = 'running' THEN 'held' ELSE 'released' END,
       NULL, false, p.status <> 'running' AND p.created_at < now() - interval '1 day',
       p.created_at + interval '2 seconds',
       CASE WHEN p.status <> 'running' THEN p.created_at + interval '10 minutes' END, NULL
  FROM plan p JOIN billing_budgetmonth b ON b.client_id = p.client_id
                                          AND b.month = date_trunc('month', p.created_at AT TIME ZONE 'UTC')::date
 WHERE p.kind = 'report' AND p.n_attempts >= 2;
-- One reservation per attempt, keyed by its upstream key (reservation_key): settled at its cost, released
-- when the provider charged nothing, held while the attempt is out or its outcome unknown. Folded into the
-- month's counters unless it is held or resolved within the last day.
INSERT INTO billing_reservation (key, budget_id, job_id, kind, model, amount, state, spent, unpriced, folded,
                                 created_at, resolved_at, parent_id)
SELECT a.upstream_key, b.id, a.job_id, 'attempt', 'sandbox/' || a.model,
       CASE a.model WHEN 'video-keyed' THEN 0.400000 WHEN 'llm' THEN 0.020000 ELSE 0.040000 END,
       CASE WHEN a.state = 'succeeded' THEN 'settled' WHEN a.state = 'failed' THEN 'released' ELSE 'held' END,
       CASE WHEN a.state = 'succeeded'
            THEN coalesce(a.cost_usd, CASE a.model WHEN 'video-keyed' THEN 0.400000 WHEN 'llm' THEN 0.020000 ELSE 0.040000 END) END,
       a.state = 'succeeded' AND a.cost_usd IS NULL,
       a.state IN ('succeeded', 'failed') AND a.finished_at < now() - interval '1 day',
       a.created_at, a.finished_at,
       CASE WHEN a.step LIKE 'chapter-%%' THEN f.id END
  FROM executor_attempt a
  JOIN plan p ON p.id = a.job_id
  JOIN billing_budgetmonth b ON b.client_id = p.client_id AND b.month = date_trunc('month', p.created_at AT TIME ZONE 'UTC')::date
  LEFT JOIN billing_reservation f ON f.key = format('fanout-%%s-1', a.job_id) AND a.step LIKE 'chapter-%%';
-- The counters as the guard keeps them (billing.models.BudgetMonth): spent holds what was folded,
-- reserved every amount not folded yet.
UPDATE billing_budgetmonth m SET spent = t.spent, reserved = t.reserved
  FROM (SELECT budget_id, coalesce(sum(spent) FILTER (WHERE folded), 0) AS spent,
               coalesce(sum(amount) FILTER (WHERE NOT folded), 0) AS reserved
          FROM billing_reservation GROUP BY budget_id) t
 WHERE m.id = t.budget_id;
-- Caps above every month (spent + reserved <= cap), with headroom that differs from client to client;
-- client 3 runs close to its cap.
UPDATE jobs_client c SET monthly_cap_usd = round(t.top * CASE WHEN bc.n = 3 THEN 1.02 ELSE 1.2 + (bc.n %% 5) * 0.2 END + 1, 2)
  FROM (SELECT client_id, max(spent + reserved) AS top FROM billing_budgetmonth GROUP BY client_id) t, bench_clients bc
 WHERE c.id = t.client_id AND bc.id = c.id;
"""),
    # One outbox row per run that ended (or waits for a person): delivered, pending, dead after its whole
    # schedule, or dead at once (nowhere to send); and each of their tries. The heavy job's 100 runs each
    # have one, with HEAVY_TRIES_PER_DELIVERY tries (replayed again and again).
    ("deliveries", """
CREATE TEMP TABLE bench_deliveries AS
WITH r AS (
    SELECT p.*, p.run AS d_run, p.status AS run_status FROM plan p WHERE p.status NOT IN ('queued', 'running')
    UNION ALL
    SELECT p.*, g, 'failed' FROM plan p CROSS JOIN LATERAL generate_series(1, p.run - 1) g WHERE p.run > 1
), d AS (
    SELECT r.*, random() AS r_d, random() AS r_t,
           CASE run_status WHEN 'succeeded' THEN 'generation.succeeded' WHEN 'failed' THEN 'generation.failed'
                           WHEN 'cancelled' THEN 'generation.cancelled' ELSE 'generation.needs_review' END AS event,
           created_at + (d_run - 1) * interval '1 hour' + n_attempts * interval '40 seconds' + interval '20 seconds' AS at
      FROM r
)
SELECT d.id AS job_id, d.client_id, d.client_n, d.d_run, d.event, d.at, d.kind, d.run_status, d.customer_n, d.campaign_n,
       format('%%s:%%s:%%s', d.id, d.d_run, d.event) AS delivery_id,
       CASE WHEN d.heavy THEN CASE WHEN d.d_run = d.run THEN 'delivered' ELSE 'dead' END
            WHEN d.r_d < 0.92 THEN 'delivered' WHEN d.r_d < 0.95 THEN 'dead' WHEN d.r_d < 0.97 THEN 'nowhere'
            ELSE 'pending' END AS fate,
       CASE WHEN d.heavy THEN %(heavy_tries)s
            WHEN d.r_d < 0.92 THEN 1 + (d.r_t < 0.1)::int + (d.r_t < 0.03)::int WHEN d.r_d < 0.95 THEN 8
            WHEN d.r_d < 0.97 THEN 0 ELSE 1 + floor(d.r_t * 3)::int END AS tries
  FROM d;
INSERT INTO webhooks_delivery (id, job_id, client_id, run, event, url, envelope, status, attempts, schedule_position,
                               next_attempt_at, last_status_code, last_error, created_at, delivered_at)
SELECT delivery_id, job_id, client_id, d_run, event, '',
       json_build_object('id', delivery_id, 'type', event, 'created_at', at,
                         'data', json_build_object('id', job_id, 'kind', kind, 'status', run_status, 'run', d_run,
                                                   'metadata', json_build_object('customer', 'c' || customer_n,
                                                                                 'campaign', 'campaign-' || campaign_n)))::text,
       CASE fate WHEN 'nowhere' THEN 'dead' ELSE fate END,
       tries, least(tries, 8),
       CASE fate WHEN 'pending' THEN now() + interval '30 minutes' ELSE at + tries * interval '5 minutes' END,
       CASE fate WHEN 'delivered' THEN 200 WHEN 'dead' THEN 503 WHEN 'pending' THEN 502 END,
       CASE fate WHEN 'delivered' THEN '' WHEN 'dead' THEN 'HTTP 503 after every try of the schedule'
                 WHEN 'nowhere' THEN 'no URL: the job names none and the client''s endpoint has none'
                 ELSE 'HTTP 502 Bad Gateway' END,
       at, CASE WHEN fate = 'delivered' THEN at + tries * interval '5 minutes' END
  FROM bench_deliveries;
INSERT INTO webhooks_deliveryattempt (delivery_id, number, attempted_at, webhook_timestamp, url, duration_ms,
                                      status_code, response_body, error)
SELECT d.delivery_id, i, d.at + i * interval '5 minutes', extract(epoch FROM d.at + i * interval '5 minutes')::bigint,
       format('https://hooks.example.com/c%%s', d.client_n), 20 + floor(random() * 900)::int,
       CASE WHEN d.fate = 'delivered' AND i = d.tries THEN 200 WHEN i %% 4 = 3 THEN NULL ELSE 503 END,
       CASE WHEN d.fate = 'delivered' AND i = d.tries THEN 'ok' WHEN i %% 4 = 3 THEN '' ELSE 'Service Unavailable' END,
       CASE WHEN i %% 4 = 3 AND NOT (d.fate = 'delivered' AND i = d.tries) THEN 'ReadTimeout: no answer within 10 s' ELSE '' END
  FROM bench_deliveries d CROSS JOIN LATERAL generate_series(1, d.tries) AS i;
"""),
    # A few paid orders for report jobs of the first client (one per run and product:
    # order_one_paid_per_run_product), and two duplicate payments.
    ("orders", """
WITH o AS (
    SELECT p.*, row_number() OVER (ORDER BY p.rn) AS k FROM plan p
     WHERE p.kind = 'report' AND p.client_n = 1 AND p.status IN ('succeeded', 'failed') ORDER BY p.rn LIMIT 24
)
INSERT INTO orders_order (id, client_id, payment_id, run_id, product, input, email, request_hash, status, job_id,
                           duplicate_of_id, mailed_at, created_at)
SELECT gen_random_uuid(), client_id, format('pi_bench_%%s', rn), format('run-%%s', rn),
       CASE WHEN k %% 3 = 0 THEN 'compatibility' ELSE 'full-report' END,
       jsonb_build_object('name', format('reader %%s', rn)), format('reader%%s@example.com', rn), md5(rn::text) || md5(id::text),
       'paid', id, NULL, NULL, created_at - interval '1 second'
  FROM o;
INSERT INTO orders_order (id, client_id, payment_id, run_id, product, input, email, request_hash, status, job_id,
                           duplicate_of_id, mailed_at, created_at)
SELECT gen_random_uuid(), o.client_id, o.payment_id || '_again', o.run_id, o.product, o.input, o.email, o.request_hash,
       'duplicate', NULL, o.id, o.created_at + interval '1 minute', o.created_at + interval '1 minute'
  FROM (SELECT * FROM orders_order ORDER BY created_at DESC LIMIT 2) o;
"""),
]


def load(database_url: str) -> tuple[float, dict]:
    """Make the data set in a fresh database; returns the seconds it took and the figures for the marker."""
    import psycopg

    params = {"clients": CLIENTS, "jobs": JOBS, "attempts": ATTEMPTS, "heavy_runs": HEAVY_RUNS,
              "heavy_attempts": HEAVY_RUNS * HEAVY_ATTEMPTS_PER_RUN, "heavy_per_run": HEAVY_ATTEMPTS_PER_RUN,
              "heavy_tries": HEAVY_TRIES_PER_DELIVERY}
    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True) as conn:
        # A bench load: a crash means a rebuild anyway, so no need to wait for each commit to be durable.
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET work_mem = '256MB'")
        conn.execute("SET maintenance_work_mem = '512MB'")
        for label, sql in LOAD:
            step = time.monotonic()
            with conn.transaction():
                for statement in split_statements(sql % params):
                    conn.execute(statement)
            print(f"  {label:<36} {time.monotonic() - step:6.1f} s", flush=True)
        step = time.monotonic()
        conn.execute("VACUUM ANALYZE")  # what autovacuum would have done to tables this old: hint bits, stats
        print(f"  {'VACUUM ANALYZE':<36} {time.monotonic() - step:6.1f} s", flush=True)
        counts = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in (
            "jobs_job", "executor_attempt", "jobs_step", "billing_reservation", "billing_budgetmonth",
            "webhooks_delivery", "webhooks_deliveryattempt", "orders_order", "jobs_reportchapter")}
        samples = dataset_samples(conn)
    return time.monotonic() - started, {"counts": counts, "samples": samples}


def split_statements(sql: str) -> list[str]:
    """The statements of one LOAD entry: split on a `;` that ends a line (none appears inside a literal)."""
    return [part.strip() for part in re.split(r";\s*\n", sql) if part.strip()]


def dataset_samples(conn) -> dict:
    """The ids PAGES names: a typical media job, a typical report, the heavy job, the largest client."""
    one = lambda sql: conn.execute(sql).fetchone()  # noqa: E731
    job, key = one("""SELECT j.id::text, j.idempotency_key FROM jobs_job j
                       WHERE j.kind = 'media' AND j.status = 'succeeded' AND j.run = 1
                         AND (SELECT count(*) FROM executor_attempt a WHERE a.job_id = j.id) = 3
                       ORDER BY j.created_at DESC LIMIT 1""")
    report = one("""SELECT id::text FROM jobs_job WHERE kind = 'report' AND status = 'succeeded'
                     AND jsonb_array_length(input -> 'chapters') = 12 ORDER BY created_at DESC LIMIT 1""")[0]
    heavy = one("SELECT job_id::text FROM executor_attempt GROUP BY job_id ORDER BY count(*) DESC LIMIT 1")[0]
    client = one("SELECT client_id::text FROM jobs_job GROUP BY client_id ORDER BY count(*) DESC LIMIT 1")[0]
    month = one("SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') - interval '2 months', 'YYYY-MM')")[0]
    return {"job": job, "idempotency_key": key, "report": report, "heavy": heavy, "client": client, "month": month,
            "month_year": month[:4], "month_month": str(int(month[5:]))}


MARKER_SQL = """CREATE TABLE IF NOT EXISTS bench_admin_dataset (
    version text PRIMARY KEY, built_at timestamptz NOT NULL DEFAULT now(), load_s double precision NOT NULL,
    made jsonb NOT NULL)"""


def dataset(database_url: str, rebuild: bool, stack: Stack) -> dict:
    """The data set's marker row, after making the data set when it is missing, of another version, or
    `rebuild` asks. Only this benchmark's own database is ever dropped."""
    import json

    import psycopg

    admin_url = database_url.rsplit("/", 1)[0] + "/postgres"
    if not rebuild:
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                row = conn.execute("SELECT made, load_s, built_at FROM bench_admin_dataset WHERE version = %s",
                                   [DATASET_VERSION]).fetchone()
                attempts = conn.execute("SELECT count(*) FROM executor_attempt").fetchone()[0] if row else None
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
            row = None
        if row and attempts == row[0]["counts"]["executor_attempt"]:
            stack.manage("migrate", "--noinput")  # a migration that landed since runs on the kept rows
            print(f"data set {DATASET_VERSION} kept from {row[2]:%Y-%m-%d %H:%M} (made in {row[1]:.0f} s; "
                  f"--rebuild makes it again)")
            return {**row[0], "load_s": row[1], "built_at": row[2]}
    print(f"making the data set in {DATABASE_NAME} ...", flush=True)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE_NAME} WITH (FORCE)")
    stack.manage("migrate", "--noinput")  # creates the database (jobs' migrate command)
    load_s, made = load(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(MARKER_SQL)
        conn.execute("INSERT INTO bench_admin_dataset (version, load_s, made) VALUES (%s, %s, %s)",
                     [DATASET_VERSION, load_s, json.dumps(made)])
    print(f"loaded in {load_s:.1f} s: " + ", ".join(f"{table} {n:,}" for table, n in made["counts"].items()))
    return {**made, "load_s": load_s, "built_at": None}


# --- the stock admin, for the baseline ------------------------------------------------------------------------


def baseline_urlconf() -> str:
    """A URLconf with the project's URLs and, under /baseline/, an AdminSite with Django's stock
    ModelAdmin for jobs: the same columns, filters and search fields as operators.admin.jobs, stock inlines."""
    import types

    from django.contrib import admin
    from django.urls import path

    import config.urls
    from executor.models import Attempt
    from jobs.models import Job, Step
    from webhooks.models import Delivery

    def stock_inline(model_class, shown):
        return type(f"Stock{model_class.__name__}Inline", (admin.TabularInline,), {
            "model": model_class, "fields": shown, "readonly_fields": shown, "extra": 0, "can_delete": False,
            "has_add_permission": lambda self, request, obj=None: False})

    class StockJobAdmin(admin.ModelAdmin):
        list_display = ("id", "client", "kind", "status", "run", "created_at", "completed_at")
        list_filter = ("status", "kind", "client")
        date_hierarchy = "created_at"
        search_fields = ("id", "idempotency_key", "attempts__upstream_key", "metadata")
        readonly_fields = [f.name for f in Job._meta.fields]
        inlines = [
            stock_inline(Step, ("run", "name", "status", "attempts", "lease_owner", "lease_until", "started_at",
                                "finished_at")),
            stock_inline(Attempt, ("number", "run", "step", "provider", "model", "upstream_key", "state",
                                   "error_class", "error", "usage", "cost_usd", "cost_source", "duration_ms",
                                   "created_at")),
            stock_inline(Delivery, ("event", "run", "status", "attempts", "last_status_code", "last_error",
                                    "next_attempt_at", "created_at")),
        ]

    site = admin.AdminSite(name="baseline")
    site.register(Job, StockJobAdmin)
    module = types.ModuleType("bench_admin_urls")
    module.urlpatterns = [*config.urls.urlpatterns, path("baseline/", site.urls)]
    for handler in ("handler400", "handler403", "handler404", "handler500"):
        setattr(module, handler, getattr(config.urls, handler))
    sys.modules[module.__name__] = module
    return module.__name__


# --- the timing -----------------------------------------------------------------------------------------------


def fill(page: dict, samples: dict) -> str:
    path = page["path"].format(**samples)
    params = {name: value.format(**samples) for name, value in page["params"].items()}
    return path + ("?" + urlencode(params) if params else "")


def whole_table_counts(queries: list[dict]) -> list[str]:
    """Statements that count a whole jobs or attempts table: a COUNT over it with no WHERE and no LIMIT."""
    found = []
    for query in queries:
        sql = " ".join(query["sql"].split()).lower()
        if "count(" not in sql or " where " in sql or " limit " in sql:
            continue
        if any(f'from "{table}"' in sql or f"from {table}" in sql for table in WHOLE_TABLES):
            found.append(query["sql"])
    return found


def time_page(client, url: str, repeats: int) -> dict:
    """Warm once, time `repeats` requests, then capture one more request's statements."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times = []
    for n in range(repeats + 1):
        started = time.perf_counter()
        response = client.get(url)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            where = f" (Location: {response['Location']})" if response.has_header("Location") else ""
            raise SystemExit(f"{url} answered {response.status_code}{where}, not 200:\n{response.content[:2000]!r}")
        if n:
            times.append(elapsed)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    queries = captured.captured_queries
    slowest = max(queries, key=lambda q: float(q["time"]), default=None)
    return {"url": url, "p50": statistics.median(times), "max": max(times), "queries": len(queries),
            "sql_ms": sum(float(q["time"]) for q in queries) * 1000,
            "whole_counts": whole_table_counts(queries), "slowest": slowest, "bytes": len(response.content)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rebuild", action="store_true", help="drop payonce_bench_admin and make the rows again")
    parser.add_argument("--repeats", type=int, default=7, help="timed requests per page (after one to warm)")
    parser.add_argument("--baseline-repeats", type=int, default=3, help="timed requests per stock page")
    parser.add_argument("--only", help="comma-separated page names from PAGES (substrings match)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the stock admin")
    parser.add_argument("--load-only", action="store_true", help="make (or keep) the data set, time nothing")
    args = parser.parse_args()

    # Only the database: nothing here starts a process or sends a message.
    os.environ["ALLOWED_HOSTS"] = "localhost"
    stack = Stack(DATABASE_URL=DATABASE_URL)
    try:
        made = dataset(DATABASE_URL, args.rebuild, stack)
        if args.load_only:
            return
        stack.configure_this_process()
        run_pages(args, made)
    finally:
        shutil.rmtree(stack.workdir, ignore_errors=True)


def run_pages(args, made: dict) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings

    samples = made["samples"]
    user = get_user_model().objects.filter(username=SUPERUSER).first()
    if user is None:
        user = get_user_model().objects.create_superuser(SUPERUSER, "bench@example.com", None)
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    names = list(PAGES)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        names = [name for name in names if any(w in name for w in wanted)]

    counts = made["counts"]
    print(f"\n{counts['executor_attempt']:,} attempts, {counts['jobs_job']:,} jobs, {counts['jobs_step']:,} steps, "
          f"{counts['billing_reservation']:,} reservations, {counts['webhooks_delivery']:,} deliveries "
          f"({counts['webhooks_deliveryattempt']:,} tries); {os.cpu_count()} CPUs; in-process Django test Client "
          f"(full middleware, no socket), {args.repeats} timed requests per page after one to warm; load average "
          f"{os.getloadavg()[0]:.2f}")
    results, baseline = {}, {}
    with override_settings(ROOT_URLCONF=baseline_urlconf()):
        for name in names:
            results[name] = time_page(client, fill(PAGES[name], samples), args.repeats)
            print(f"  {name:<34} p50 {results[name]['p50']:8.1f} ms  max {results[name]['max']:8.1f} ms  "
                  f"{results[name]['queries']:3d} statements ({results[name]['sql_ms']:.1f} ms in SQL)", flush=True)
        if not args.no_baseline:
            for name in names:
                if name in BASELINE:
                    baseline[name] = time_page(client, fill(BASELINE[name], samples), args.baseline_repeats)
                    print(f"  stock: {name:<27} p50 {baseline[name]['p50']:8.1f} ms  max {baseline[name]['max']:8.1f} "
                          f"ms  {baseline[name]['queries']:3d} statements", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    report(results, baseline)


def report(results: dict, baseline: dict) -> None:
    print("\n| page | p50 ms | max ms | statements | of which SQL ms | stock admin p50 ms | stock statements |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in results.items():
        stock = baseline.get(name)
        stock_cells = f"{stock['p50']:.1f} | {stock['queries']}" if stock else "n/a | "
        print(f"| {name} | {row['p50']:.1f} | {row['max']:.1f} | {row['queries']} | {row['sql_ms']:.1f} | {stock_cells} |")
    print("\n" + "\n".join(f"  {name}: {row['url']} ({row['bytes']:,} bytes)" for name, row in results.items()))

    for name, row in results.items():
        if row["p50"] >= TARGET_MS and row["slowest"]:
            print(f"\nOVER {TARGET_MS:.0f} ms: {name} ({row['p50']:.1f} ms, {row['sql_ms']:.1f} ms in SQL); its slowest "
                  f"statement took {row['slowest']['time']} s:\n  {_cut(row['slowest']['sql'])}\n"
                  f"{_cut(explain(row['slowest']['sql']), 4000)}")
    for name, row in baseline.items():
        if row["whole_counts"]:
            print(f"stock {name}: {len(row['whole_counts'])} statement(s) count a whole table")

    def figure(label: str, names: list[str]) -> None:
        """The slowest page of a group as one headline figure, beside the stock admin's same page."""
        if not names:
            return
        worst = max(names, key=lambda name: results[name]["p50"])
        value, stock = results[worst]["p50"], baseline.get(worst)
        record(f"admin {label} ({worst}), p50, 1,000,000 attempts" if len(names) > 1 else
               f"admin {label}, p50, 1,000,000 attempts", value, "ms",
               baseline=stock["p50"] if stock else None, baseline_is="Django's stock ModelAdmin" if stock else None,
               ratio=value / stock["p50"] if stock else None, target=f"< {TARGET_MS:.0f} ms", met=value < TARGET_MS)

    of_kind = lambda kind: [name for name in results if PAGES[name]["kind"] == kind]  # noqa: E731
    figure("job list, unfiltered", [name for name in results if name == "job list"])
    figure("job list, slowest filter or search", [name for name in of_kind("list") if name != "job list"])
    figure("job page, slowest typical", [name for name in of_kind("job") if "heavy" not in name])
    figure("job page, heavy job", [name for name in of_kind("job") if "heavy" in name])
    figure("spend, dead letters and bulk previews, slowest", of_kind("other"))

    bad = {name: row["whole_counts"] for name, row in results.items() if row["whole_counts"]}
    if bad:
        raise SystemExit("a page counted a whole table (no WHERE, no LIMIT):\n" + "\n".join(
            f"  {name}: {sql[:400]}" for name, sqls in bad.items() for sql in sqls))
    missed = [name for name in of_kind("list") + of_kind("job") if results[name]["p50"] >= TARGET_MS]
    print(f"\ntarget: the job list and job pages under {TARGET_MS:.0f} ms (p50): "
          + (f"MISSED by {', '.join(missed)}" if missed else "met"))
    if over := [name for name in of_kind("other") if results[name]["p50"] >= TARGET_MS]:
        print(f"other pages over {TARGET_MS:.0f} ms: {', '.join(over)}")


def explain(sql: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a captured statement (a server-side cursor's SELECT is explained bare)."""
    from django.db import connection

    sql = re.sub(r"^\s*DECLARE .*? CURSOR .*? FOR ", "", sql, count=1, flags=re.S)
    if not re.match(r"\s*(SELECT|WITH)\b", sql, flags=re.I):
        return "  (not a SELECT: not explained)"
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        return "\n".join("    " + line for (line,) in cursor.fetchall())


def _cut(text: str, limit: int = 600) -> str:
    """A long statement (a job page's IN list of 2,000 keys) printed as its start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


if __name__ == "__main__":
    main()

