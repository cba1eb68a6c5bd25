"""A real SMTP server for the tests (aiosmtpd), as a process of its own: every message it takes is written
to a directory as one JSON file, so a test reads what was really sent over SMTP.

    python tests/support/smtp_server.py PORT DIRECTORY
"""

import asyncio
import email
import json
import sys
import time
import uuid
from email import policy
from pathlib import Path


class Keep:
    def __init__(self, directory: Path):
        self.directory = directory

    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.content, policy=policy.default)
        body = message.get_body(preferencelist=("plain",))
        record = {"from": envelope.mail_from, "to": envelope.rcpt_tos, "subject": message["subject"],
                  "body": body.get_content() if body else "", "at": time.time()}
        (self.directory / f"{time.time_ns()}-{uuid.uuid4().hex[:6]}.json").write_text(json.dumps(record))
        return "250 OK"


def main() -> None:
    from aiosmtpd.controller import Controller

    port, directory = int(sys.argv[1]), Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    controller = Controller(Keep(directory), hostname="127.0.0.1", port=port)
    controller.start()
    print("smtp ready", flush=True)
    try:
        asyncio.run(asyncio.Event().wait())
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
