"""The console mail backend (`EMAIL_URL=console://`): each mail as a few readable lines (from, to, subject,
the text body) in the process's log, with secrets redacted. Django's own prints the whole MIME message to
stdout, which in a Celery worker becomes one JSON WARNING line of `celery.redirected`.

A report mail's link is a bearer token to a buyer's report, and the log is collected by whatever runs the
process: by default the link is redacted like every other secret (config.logs), the report staying readable
through the API (GET /v1/jobs/{id}/report). In development that printed mail is the only way to the link the
buyer would get, so EMAIL_CONSOLE_LINKS (on in `make run`) prints it whole; every other secret stays
redacted. The mail sent through SMTP is untouched."""

import logging

from django.conf import settings
from django.core.mail.backends.base import BaseEmailBackend

from config.logs import Redactor

_REDACTOR = Redactor()  # the shapes only: a mail holds no environment secret
_SHOWING_LINKS = Redactor(report_links=False)
log = logging.getLogger("payonce.mail")


def readable(message) -> str:
    """A mail as its reader sees it: the headers that matter, then the text body."""
    lines = [f"From: {message.from_email}", f"To: {', '.join(message.to)}"]
    if message.cc:
        lines.append(f"Cc: {', '.join(message.cc)}")
    lines.append(f"Subject: {message.subject}")
    attached = [attachment[0] if isinstance(attachment, tuple) else attachment.get_filename()
                for attachment in message.attachments]
    if attached:
        lines.append(f"Attached: {', '.join(str(name) for name in attached)}")
    body = message.body.rstrip("\n")
    return "\n".join(lines) + "\n\n" + "\n".join(f"  {line}" for line in body.splitlines())


class EmailBackend(BaseEmailBackend):
    """Writes each mail to `stream` when one is given (a test), else logs it (INFO, `payonce.mail`)."""

    def __init__(self, *args, stream=None, **kwargs):
        self.stream = stream
        super().__init__(*args, **kwargs)

    def send_messages(self, messages):
        links = settings.EMAIL_CONSOLE_LINKS
        for message in messages:
            text = (_SHOWING_LINKS if links else _REDACTOR).text(readable(message))
            if self.stream is not None:
                self.stream.write(f"{text}\n")
            else:
                log.info("mail (EMAIL_URL=console://, not sent)\n%s", text, extra={"shows_report_links": links})
        return len(messages)
