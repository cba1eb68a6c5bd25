"""Jobs, their steps and reports: the record of truth for what a client asked for and where it is. The client
itself is the accounts app's (accounts.models), below this one."""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Client


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A job in one of these states may still change; every writer that ends a job matches only these.
OPEN_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING)
TERMINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


# A job's priority: higher is started sooner; within a level, clients take turns (jobs.dispatch).
PRIORITY_MIN, PRIORITY_DEFAULT, PRIORITY_MAX = 1, 3, 5


def job_kinds() -> list[tuple[str, str]]:
    """The job kinds as choices: the names in jobs.kinds.KINDS, the one table of kinds (a kind is one module and
    one line there). A callable, so a new kind needs no migration of this column; the API's JobKind enum is the
    same list (config/settings.py, ENUM_NAME_OVERRIDES; jobs.api.serializers.KindField)."""
    from jobs.kinds import KINDS  # at call time: jobs.kinds imports this module (its steps write jobs)

    return [(name, name.replace("_", " ").capitalize()) for name in KINDS]  # labels as TextChoices made them


class Job(models.Model):
    """One key + one body = one job (docs/design.md, "One key and one body are one job")."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey(Client, on_delete=models.PROTECT, related_name="jobs")
    idempotency_key = models.CharField(max_length=255)
    # SHA-256 (hex) of the canonical validated body: same key with another body is a conflict.
    request_hash = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=job_kinds)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    # Goes up by one on each person's retry; every event and step belongs to a run.
    run = models.PositiveIntegerField(default=1)
    # The attempt chain, "provider/model", primary first (the API field `models`).
    model_chain = models.JSONField()
    input = models.JSONField()
    policy = models.JSONField()
    output_key = models.CharField(max_length=1024)
    webhook_url = models.CharField(max_length=2048, blank=True, default="")
    metadata = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    # {"code": "...", "message": "..."} once the job failed or waits for a person.
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # The enqueue lease: a message sent for this job is expected to pick it up before then. Past it, with
    # no live step lease and no step finished recently, the sweeper sends another
    # (docs/design.md, "Recovery: the sweeper").
    lease_until = models.DateTimeField(default=timezone.now)
    # Fair dispatch (jobs.dispatch): a queued job is started by priority first (higher sooner), then in its
    # client's turn; `holds_slot` says it counts against its client's running limit (from its start until it
    # waits on a provider or ends).
    priority = models.PositiveSmallIntegerField(default=PRIORITY_DEFAULT)
    holds_slot = models.BooleanField(default=False)
    # The trace of the current run (config.tracing): the W3C traceparent of the span that created it (the
    # create or retry request, a paid order), so every later step, in whatever process, joins that trace.
    # None when traces are off or the run was not sampled.
    trace_context = models.CharField(max_length=55, null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                                   name="job_priority_range"),
            # Two identical requests racing make one row: the loser's INSERT does nothing (jobs.services).
            models.UniqueConstraint(fields=["client", "idempotency_key"], name="job_client_idempotency_key"),
            # An output key is claimed by its job when the job is created
            # (docs/design.md, "The output key: read back before paying"): a second job of the same client naming a
            # held key is refused at submit, before anything is paid, instead of paying and then finding the key
            # written (jobs.services turns the violation into
            # OutputKeyConflict). Keys of different clients never meet: the store keeps them apart.
            models.UniqueConstraint(fields=["client", "output_key"], name="job_client_output_key"),
            models.CheckConstraint(condition=Q(run__gte=1), name="job_run_positive"),
        ]
        # The admin's actions, each a permission of its own beside Django's view_job (operators.admin.jobs): a staff
        # user may read jobs without being able to pay again. Replaying a job's deliveries needs
        # webhooks.replay_delivery.
        permissions = [
            ("retry_job", "Can retry jobs (a new run: pays again)"),
            ("cancel_job", "Can cancel jobs"),
        ]
        indexes = [
            # GET /v1/jobs: a client's jobs, newest first, optionally by status.
            models.Index(fields=["client", "-created_at", "-id"], name="job_client_created"),
            models.Index(fields=["client", "status", "-created_at"], name="job_client_status_created"),
            # The operators' job list (operators.admin.jobs): every client's jobs newest first, and by status, a page
            # at a time without sorting the whole table (bench/admin.py).
            models.Index(fields=["-created_at", "-id"], name="job_created"),
            models.Index(fields=["status", "-created_at", "-id"], name="job_status_created"),
            # The sweeper looks only at jobs that should be moving.
            models.Index(
                fields=["lease_until"],
                name="job_moving_lease",
                condition=Q(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]),
            ),
            # Fair dispatch reads the queued jobs only: which clients have any (a skip scan), and each
            # one's next by priority and age.
            models.Index(fields=["client", "-priority", "created_at"], name="job_queued",
                         condition=Q(status=JobStatus.QUEUED)),
            # A client's jobs holding a slot, counted against its running limit.
            models.Index(fields=["client"], name="job_holding_slot", condition=Q(holds_slot=True)),
        ]

    def __str__(self):
        return f"{self.kind} job {self.id} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    # An API cancel is final: nothing is paid for a cancelled job. The layers below the job engine (the
    # executor, billing) are handed the job and ask it, rather than reading jobs' table themselves.
    # As SQL, on the parameter %(job)s, for a statement that reserves money (billing.services.reserve_then):
    # read in that statement, it closes the race of a cancel committed between deciding to pay and paying.
    NOT_CANCELLED_SQL = f"NOT EXISTS (SELECT 1 FROM jobs_job WHERE id = %(job)s AND status = '{JobStatus.CANCELLED}')"

    def cancelled_now(self) -> bool:
        """Whether the job is cancelled now (read from the table, not from this instance)."""
        return Job.objects.filter(id=self.id, status=JobStatus.CANCELLED).exists()


class StepStatus(models.TextChoices):
    RUNNING = "running"  # claimed: the holder of the lease is doing (or waiting on) the work
    DONE = "done"  # finished; `result` is what every later delivery of the step returns
    FAILED = "failed"  # ended the run with an error (kept in `result`)


class Step(models.Model):
    """A checkpoint: one named step of one run of a job (docs/design.md, "How a job runs: durable steps").

    A `done` step is never run again: a second delivery returns `result`. A `running` step belongs to
    `lease_owner` until `lease_until`; the holder renews the lease while it works, and a step whose
    lease ran out (its worker died) is taken over.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="steps")
    run = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    result = models.JSONField(null=True, blank=True)
    # How many executions claimed it (1 unless a lease ran out and another execution took over).
    attempts = models.PositiveIntegerField(default=1)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One row per step per run: two executions of a step race on this key, and only one claims it.
            models.UniqueConstraint(fields=["job", "run", "name"], name="step_job_run_name"),
        ]

    def __str__(self):
        return f"{self.job_id} run {self.run} {self.name} ({self.status})"


class Report(models.Model):
    """A report job's durable record (docs/design.md, "Reports and orders"): what it was written from, what was written,
    and whether it was sealed and delivered. Its chapters outlive any one run, so a person's retry reuses
    every chapter an earlier run finished."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="report", primary_key=True)
    # The personal input (removed by purge_personal_data after the retention period) ...
    subject = models.JSONField(null=True, blank=True)
    email = models.CharField(max_length=254, blank=True, default="")
    # ... and what the report keeps when it is gone: the figures saved onto it at the first step.
    figures = models.JSONField(default=dict)
    chapter_keys = models.JSONField(default=list)
    # The template version it is written from, pinned by the job at submit; None: the built-in default
    # (jobs.kinds.report.templates.DEFAULT).
    template_version = models.ForeignKey("ReportTemplateVersion", on_delete=models.PROTECT, null=True, blank=True,
                                         related_name="+")
    # Its title, chapter headings, closing and mail, rendered from that version for its subject at its
    # first step ({} for a report loaded before templates: the default's, which read no subject field).
    layout = models.JSONField(default=dict, blank=True)
    synthesis = models.TextField(null=True, blank=True)  # every chapter reads it; never delivered
    sealed_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_error = models.TextField(blank=True, default="")
    purged_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"report {self.job_id}"


REPORT_TEMPLATE_NAME_CONSTRAINT = "report_template_client_name"
REPORT_TEMPLATE_VERSION_CONSTRAINT = "report_template_version_number"


class ReportTemplate(models.Model):
    """A client's own report template (docs/design.md, "Report templates"): a name, its versions, and the
    version its `live` label points at (what a job naming the template without a version is written from)."""

    client = models.ForeignKey(Client, on_delete=models.PROTECT, related_name="report_templates")
    name = models.CharField(max_length=64)
    live = models.PositiveIntegerField(default=1)  # the number of the version `live` points at
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # One name per client: two first POSTs of one name racing make one template (the loser reads it).
            models.UniqueConstraint(fields=["client", "name"], name=REPORT_TEMPLATE_NAME_CONSTRAINT),
        ]

    def __str__(self):
        return self.name


class ReportTemplateVersion(models.Model):
    """One version, immutable once written: its body is the API's form, as the client wrote it. A job pins
    one at submit (its input names it), so nothing edited later changes a report already accepted."""

    template = models.ForeignKey(ReportTemplate, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    body = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Numbers are the template's own, 1, 2, 3...: two edits racing cannot both be version n.
            models.UniqueConstraint(fields=["template", "number"], name=REPORT_TEMPLATE_VERSION_CONSTRAINT),
        ]

    def __str__(self):
        return f"{self.template.name} v{self.number}"


class ChapterStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class ReportChapter(models.Model):
    """One chapter of a report. Once `done` it is never written again: its text is kept byte for byte,
    whatever run, retry or resume comes after."""

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="chapters")
    key = models.CharField(max_length=64)
    position = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=ChapterStatus.choices, default=ChapterStatus.PENDING)
    text = models.TextField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    run = models.PositiveIntegerField(null=True, blank=True)  # the run that wrote it
    attempt = models.PositiveIntegerField(null=True, blank=True)  # the attempt whose answer it is
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["report", "key"], name="report_chapter_key"),
        ]
        ordering = ["position"]

    def __str__(self):
        return f"{self.report_id} {self.key} ({self.status})"


class ClientTurn(models.Model):
    """A client's place in the rotation of fair dispatch (jobs.dispatch): stride scheduling. Each start of one
    of its jobs moves its `pass` on by 1/weight; the client with ready work and the lowest pass goes next.
    Written under the client's start lock (an advisory lock, jobs.dispatch), and only while other clients
    have work queued too."""

    client = models.OneToOneField(Client, on_delete=models.CASCADE, primary_key=True, related_name="turn")
    # Null until its first start: a client new to the rotation goes first, once.
    pass_value = models.FloatField(null=True, db_column="pass")
    # A starter passed this client over at its running limit: a slot it frees rings for its next job.
    blocked = models.BooleanField(default=False)
    last_at = models.DateTimeField(null=True)
