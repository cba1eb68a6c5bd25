"""The console mail backend (`EMAIL_URL=console://`) with secrets redacted: Django's own prints every mail
whole, and a report mail's link is a bearer token to a buyer's report, so the printed mail (a worker's
log, captured by whatever collects its output) shows the link redacted like every other secret
(config.logs). The mail sent through SMTP is untouched."""

import io

from django.core.mail.backends import console

from config.logs import Redactor

_REDACTOR = Redactor()  # the shapes only: a mail holds no environment secret


class EmailBackend(console.EmailBackend):
    def write_message(self, message):
        printed, stream = io.StringIO(), self.stream
        self.stream = printed
        try:
            super().write_message(message)
        finally:
            self.stream = stream
        self.stream.write(_REDACTOR.text(printed.getvalue()))
