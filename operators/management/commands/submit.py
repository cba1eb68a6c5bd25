"""manage.py submit: create a job as POST /v1/jobs does (the API's serializer, then jobs.services.job_create),
print it, and with --wait follow it until it ends."""

import json
import uuid

from django.conf import settings
from rest_framework.exceptions import ValidationError

from jobs import services
from jobs.api.errors import ApiError, IdempotencyKeyInvalid, PayloadTooLarge, api_exception_handler
from jobs.api.serializers import JobCreateSerializer, job_as_dict
from jobs.api.parsers import idempotency_key_valid
from jobs.models import Job, JobStatus
from operators import cli


class Command(cli.OperatorCommand):
    help = ("Submit a job as POST /v1/jobs does, for --client (default: the demo client `make run` creates), "
            "and print it. The same --key and body again is the same job (nothing is paid twice); without "
            "--key a fresh one is made and printed. --wait follows the job until it ends (exit 0 if it "
            "succeeded, 1 otherwise). A body the API would refuse prints the API's error and exits 2.")

    def add_arguments(self, parser):
        parser.add_argument("--model", action="append", dest="models", required=True, metavar="PROVIDER/MODEL",
                            help="a model of the chain, in order (repeatable: the next is the fallback)")
        parser.add_argument("--prompt", help="a media job's prompt (required for media)")
        parser.add_argument("--input", dest="input_json", metavar="JSON",
                            help="the whole input as a JSON object instead of --prompt/--render-s (a media "
                                 "job's prompt, references and the parameters its models declare; a report's "
                                 '{"subject": {...}, "chapters": [...], "email": "..."})')
        parser.add_argument("--client", default="", help="a client's id, or its exact name")
        parser.add_argument("--kind", default="media", help="media (default) or report")
        parser.add_argument("--render-s", type=float, help="a media job's render time, in seconds")
        parser.add_argument("--key", default="", help="the Idempotency-Key (default: a fresh uuid, printed)")
        parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                            help="a metadata pair (repeatable)")
        parser.add_argument("--wait", action="store_true", help="follow the job until it ends")
        parser.add_argument("--json", action="store_true", help="print the job as JSON, as the API answers (with --wait: once, as it ended)")

    def handle(self, *args, **options):
        client = cli.one_client(options["client"]) if options["client"].strip() else cli.demo_client()
        key = options["key"] or str(uuid.uuid4())
        body = self.body(options)
        try:
            if not idempotency_key_valid(key):
                raise IdempotencyKeyInvalid("The Idempotency-Key must be 1 to 255 visible ASCII characters.")
            size = len(json.dumps(body).encode("utf-8"))
            if size > settings.JOB_BODY_MAX_BYTES:
                limit = settings.JOB_BODY_MAX_BYTES
                raise PayloadTooLarge(f"The request body is larger than {limit} bytes.", limit_bytes=limit)
            # What the view does (jobs.api.views.JobListCreateView.post), with the same refusals.
            serializer = JobCreateSerializer(data=body, client=client)
            serializer.is_valid(raise_exception=True)
            job, created = services.job_create(client=client, idempotency_key=key, data=serializer.validated_data)
        except (ApiError, ValidationError) as exc:
            self.refuse_like_the_api(exc, as_json=options["json"])
        shown = job_as_dict(Job.objects.get(id=job.id))
        if options["json"] and not options["wait"]:
            cli.print_json(self.stdout, shown)
            return
        if not options["json"]:
            said = "created" if created else "replayed (this key and body are already this job; nothing new is paid)"
            self.stdout.write(f"Job {shown['id']} {said}: {shown['kind']} on {', '.join(shown['models'])}, "
                              f"{shown['status']}, for {client.name} ({client.id}).")
            self.stdout.write(f"  Idempotency-Key: {key}  (submit again with --key {key} to get this job, "
                              "never a second one)")
        if not options["wait"]:
            return
        status = cli.follow(job, stdout=self.stdout, stderr=self.stderr, as_json=False, quiet=options["json"])
        ended = job_as_dict(Job.objects.get(id=job.id))
        if options["json"]:
            cli.print_json(self.stdout, ended)
        else:
            cli.write_lines(self.stdout, cli.end_lines(ended))
        if status == "interrupted":
            cli.exit_with(cli.EXIT_INTERRUPTED)
        cli.exit_with(cli.EXIT_OK if status == JobStatus.SUCCEEDED else cli.EXIT_FAILED)

    def body(self, options) -> dict:
        """POST /v1/jobs's body from the options; the serializer, not this, decides whether it is valid."""
        if options["input_json"] is not None:
            try:
                job_input = json.loads(options["input_json"])
            except ValueError as exc:
                raise cli.refused(f"--input is not JSON: {exc}") from None
        else:
            job_input = {}
            if options["prompt"] is not None:
                job_input["prompt"] = options["prompt"]
            if options["render_s"] is not None:
                job_input["render_s"] = options["render_s"]
        body = {"kind": options["kind"], "models": options["models"], "input": job_input}
        if options["metadata"]:
            pairs = [pair.partition("=") for pair in options["metadata"]]
            bad = [name for name, sign, _ in pairs if not sign or not name.strip()]
            if bad:
                raise cli.refused("--metadata takes KEY=VALUE")
            body["metadata"] = {name.strip(): value for name, _, value in pairs}
        return body

    def refuse_like_the_api(self, exc, *, as_json: bool):
        """The API's own answer to this error (jobs.api.errors.api_exception_handler): its code, message and
        fields, on stderr; exit 2. Nothing was written."""
        error = api_exception_handler(exc, {}).data["error"]
        if as_json:
            cli.print_json(self.stderr, {"error": error})
        else:
            self.stderr.write(f"{error['code']}: {error['message']}")
            for name, problem in (error.get("fields") or {}).items():
                self.stderr.write(f"  {name}: {json.dumps(problem)}")
            for name, value in error.items():
                if name not in ("code", "message", "fields"):
                    self.stderr.write(f"  {name}: {value}")
        raise SystemExit(cli.EXIT_REFUSED)
