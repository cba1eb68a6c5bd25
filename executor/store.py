"""The output store: where finished media lands, tagged with the job that wrote it (DESIGN.md, section 4).

Writes are create-only, so two writers can never both land on one key; `head` tells a retry whether its
own output is already there (then nothing is paid again) or another job's is (a conflict).
"""

import itertools
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int | None
    content_type: str
    metadata: dict  # written_by (job id), provider, model, attempt
    complete: bool = True  # False: the key is claimed but its bytes have not landed yet

    @property
    def written_by(self) -> str | None:
        return self.metadata.get("written_by")


class OutputKeyTaken(Exception):
    """A create-only write found the key already written (or claimed) by another job."""

    def __init__(self, existing: StoredObject):
        super().__init__(f"output key {existing.key!r} already written by job {existing.written_by}")
        self.existing = existing


class FileStore:
    """Objects at `root/<key>`; each object's metadata beside it, at `root/<dir>/.<name>.payonce.json`
    (keys may not have parts that start with a dot, so the two never meet).

    A write first claims the key by linking its metadata file into place (`os.link` fails if the name
    exists: an exclusive create, and the file is complete when it appears), then links the fully written
    and fsynced bytes the same way. A claim left without bytes by a crash belongs to the job named in
    it, which completes it on its next pass.
    """

    _names = itertools.count()

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def _paths(self, key: str) -> tuple[str, str]:
        # Keys are validated at submit; checked again here, lexically.
        parts = key.split("/")
        if key.startswith("/") or any(not part or part.startswith(".") for part in parts) or "\x00" in key:
            raise ValueError(f"output key {key!r} is not a store key")
        data = os.path.join(self.root, key)
        directory, name = os.path.split(data)
        return data, os.path.join(directory, f".{name}.payonce.json")

    def head(self, key: str) -> StoredObject | None:
        data, meta = self._paths(key)
        try:
            with open(meta, "rb") as handle:
                info = json.loads(handle.read())
        except FileNotFoundError:
            return None
        try:
            size = os.stat(data).st_size
        except FileNotFoundError:
            return StoredObject(key, None, info.get("content_type", ""), info["metadata"], complete=False)
        return StoredObject(key, size, info.get("content_type", ""), info["metadata"])

    def _link_new(self, path: str, payload: bytes, *, durable: bool) -> bool:
        """Write payload to a temporary file and link it to `path`; False if `path` already exists."""
        tmp = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-{next(self._names)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                if durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def put(self, key: str, payload: bytes, *, content_type: str, metadata: dict) -> StoredObject:
        """Create-only write. Raises OutputKeyTaken if another job holds the key."""
        data, meta = self._paths(key)
        os.makedirs(os.path.dirname(data), exist_ok=True)
        claim = json.dumps({"content_type": content_type, "metadata": metadata}, sort_keys=True).encode()
        # The claim needs no fsync: lost in a power failure, it is written again on the next pass, and
        # the bytes (fsynced) are never replaced by another job's because their link is create-only.
        if not self._link_new(meta, claim, durable=False):
            existing = self.head(key)
            if existing is None or existing.written_by != metadata.get("written_by"):
                raise OutputKeyTaken(existing or StoredObject(key, None, "", {}, complete=False))
            if existing.complete:
                return existing  # our own earlier write landed: a completed upload is idempotent
            metadata = existing.metadata  # complete our own claim, keeping what it recorded
        self._link_new(data, payload, durable=True)
        return StoredObject(key, len(payload), content_type, metadata)

    def open(self, key: str):
        data, _ = self._paths(key)
        return open(data, "rb")

    def presigned_url(self, key: str) -> str | None:
        return None  # served by the API (GET /v1/jobs/{id}/output)


@lru_cache(maxsize=4)
def _store_for(url: str):
    parts = urlsplit(url)
    if parts.scheme == "file":
        # file://./var/outputs is relative to the project directory, file:///srv/outputs absolute.
        root = Path(parts.netloc + parts.path)
        if not root.is_absolute():
            root = settings.BASE_DIR / root
        return FileStore(root)
    if parts.scheme == "s3":
        # s3://bucket[/prefix]; credentials, region and AWS_ENDPOINT_URL from the environment.
        from executor.s3store import S3Store

        return S3Store.from_url(url)
    raise ValueError(f"OUTPUT_STORE_URL: unsupported scheme {parts.scheme!r} (file:// or s3://)")


def get_store():
    return _store_for(settings.OUTPUT_STORE_URL)
