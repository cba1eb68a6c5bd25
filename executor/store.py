"""The output store: where finished media lands, tagged with the job that wrote it (DESIGN.md, section 4).

Writes are create-only, so two writers can never both land on one key; `head` tells a retry whether its
own output is already there (then nothing is paid again) or another job's is (a conflict).
"""

import json
import os
import tempfile
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
    """Objects under `root/data/<key>`, their metadata under `root/meta/<key>.json`.

    A write first claims the key by linking its metadata file into place (`os.link` fails if the name
    exists: an exclusive create), then links the fully written bytes. A claim left without bytes by a
    crash belongs to the job named in it, which completes it on its next pass.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def _paths(self, key: str) -> tuple[Path, Path]:
        data = (self.root / "data" / key).resolve()
        meta = (self.root / "meta" / (key + ".json")).resolve()
        for path in (data, meta):
            if self.root not in path.parents:
                raise ValueError(f"output key {key!r} leaves the store")
        return data, meta

    def head(self, key: str) -> StoredObject | None:
        data, meta = self._paths(key)
        try:
            info = json.loads(meta.read_text())
        except FileNotFoundError:
            return None
        try:
            size = data.stat().st_size
        except FileNotFoundError:
            return StoredObject(key, None, info.get("content_type", ""), info["metadata"], complete=False)
        return StoredObject(key, size, info.get("content_type", ""), info["metadata"])

    @staticmethod
    def _link_new(path: Path, payload: bytes) -> bool:
        """Write payload to a temporary file and link it to `path`; False if `path` already exists."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
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
        claim = json.dumps({"content_type": content_type, "metadata": metadata}, sort_keys=True).encode()
        if not self._link_new(meta, claim):
            existing = self.head(key)
            if existing is None or existing.written_by != metadata.get("written_by"):
                raise OutputKeyTaken(existing or StoredObject(key, None, "", {}, complete=False))
            if existing.complete:
                return existing  # our own earlier write landed: a completed upload is idempotent
            metadata = existing.metadata  # complete our own claim, keeping what it recorded
        self._link_new(data, payload)
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
    raise ValueError(f"OUTPUT_STORE_URL: unsupported scheme {parts.scheme!r} (file:// or s3://)")


def get_store():
    return _store_for(settings.OUTPUT_STORE_URL)
