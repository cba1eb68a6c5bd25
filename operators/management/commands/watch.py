"""manage.py watch: follow a job's progress as its event stream does (GET /v1/jobs/{id}/events reads
jobs.selectors.job_snapshot; so does this), with a live bar on a terminal, until it ends."""

import uuid

from jobs.api.serializers import job_as_dict
from jobs.models import Job, JobStatus
from operators import cli


class Command(cli.OperatorCommand):
    help = ("Follow a job until it ends: a live progress bar (a report's chapters, a media job's steps), the cost "
            "so far and one line per change. Exit 0 succeeded, 1 failed or cancelled, 3 waiting for a person "
            "(what they must decide is printed), 130 on Ctrl-C (the job goes on). --json prints each snapshot "
            "as one JSON line instead, the data of the event stream's frames.")

    def add_arguments(self, parser):
        parser.add_argument("job_id")
        parser.add_argument("--json", action="store_true", help="one JSON line per snapshot, no bar")

    def handle(self, *args, job_id, **options):
        as_json = options["json"]
        try:
            ident = uuid.UUID(job_id.strip())
        except ValueError:
            raise cli.refused(f"{job_id!r} is not a job id") from None
        job = Job.objects.filter(id=ident).only("id", "client_id", "kind", "status").first()
        if job is None:
            raise cli.refused(f"no job has the id {ident}")
        status = cli.follow(job, stdout=self.stdout, stderr=self.stderr, as_json=as_json)
        if status == "interrupted":
            cli.exit_with(cli.EXIT_INTERRUPTED)
        if status not in cli.EXIT_FOR:  # deleted while followed
            raise cli.refused(f"the job {ident} is gone (purged?)")
        ended = job_as_dict(Job.objects.get(id=ident))
        if not as_json:
            cli.write_lines(self.stdout, cli.end_lines(ended))
        elif status == JobStatus.WAITING:  # the last JSON line says "waiting"; what to decide goes to stderr
            cli.write_lines(self.stderr, cli.end_lines(ended))
        cli.exit_with(cli.EXIT_FOR[status])
