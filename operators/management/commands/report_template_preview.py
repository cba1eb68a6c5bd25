"""manage.py report_template_preview: a report template's version rendered for a sample subject, and the most a
report from it may reserve at a model's rate card, without calling a model (the admin's preview, on the command
line: both read jobs.kinds.report.reports.preview)."""

import json

from django.conf import settings

from jobs.kinds.report import reports, templates
from operators import cli


class Command(cli.OperatorCommand):
    help = ("Render a client's report template (its live version, or --template-version N) for a sample subject: the system "
            "prompt, the synthesis prompt, every chapter's prompt, the layout and the mail, and the worst case of "
            "a report from it at --model's rate card (what the budget's pre-flight reserves). Calls no model. "
            "The name `default` with no such template of the client's is the built-in template.")

    def add_arguments(self, parser):
        parser.add_argument("name", help="the template's name")
        parser.add_argument("--subject", required=True, help='the sample subject, JSON: \'{"name": "Ada"}\'')
        parser.add_argument("--template-version", dest="number", type=int, default=None,
                            help="a version number (default: where live points)")
        parser.add_argument("--chapters", default="", help="comma-separated chapter keys (default: all the template's)")
        parser.add_argument("--model", default=settings.ORDER_REPORT_MODEL,
                            help=f"the model priced (default: ORDER_REPORT_MODEL, {settings.ORDER_REPORT_MODEL})")
        parser.add_argument("--client", default="", help="a client's id or exact name (default: the demo client)")
        parser.add_argument("--json", action="store_true", help="the whole preview as JSON")

    def handle(self, *args, name, subject, number, chapters, model, **options):
        client = cli.one_client(options["client"]) if options["client"].strip() else cli.demo_client()
        try:
            sample = json.loads(subject)
        except ValueError as exc:
            raise cli.refused(f"--subject is not JSON: {exc}") from None
        if not isinstance(sample, dict) or not sample:
            raise cli.refused("--subject is a JSON object with at least one field")
        row = templates.version_row(client_id=client.id, name=name, number=number)
        if row is None and not (name == templates.DEFAULT_NAME and number in (None, 1)):
            raise cli.refused(f"{client.name} has no report template {name!r}" + (f" v{number}" if number else ""))
        keys = [key.strip() for key in chapters.split(",") if key.strip()] or None
        if row is None and keys is None:
            raise cli.refused("the built-in template takes any chapter keys: name some with --chapters")
        try:
            shown = reports.preview(version_id=row.id if row else None, subject=sample, model=model,
                                    client_id=client.id, chapters=keys)
        except templates.TemplateProblem as problem:
            raise cli.refused(f"{problem.field}: {problem.message}") from None
        except KeyError as exc:
            raise cli.refused(f"not a chapter of the template: {exc}") from None
        if options["json"]:
            cli.print_json(self.stdout, shown)
            return
        self.stdout.write(f"system:\n{shown['system']}\n")
        if shown["synthesis"] is not None:
            self.stdout.write(f"\nsynthesis:\n{shown['synthesis']}\n")
        for chapter in shown["chapters"]:
            self.stdout.write(f"\nchapter {chapter['key']} ({chapter['heading']}):\n{chapter['prompt']}\n")
        worst = shown["worst_case"]
        self.stdout.write(f"\ntitle: {shown['layout']['title']}\nmail subject: {shown['layout']['mail_subject']}\n")
        self.stdout.write(f"worst case at {worst['model']}: ${worst['total_usd']} (synthesis ${worst['synthesis_usd']}, "
                          f"{worst['chapters']} chapters at ${worst['per_chapter_usd']} each)\n")
