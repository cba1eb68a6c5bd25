"""The output store: where finished media lands, tagged with the job that wrote it
(docs/design.md, "The output key: read back before paying").

Writes are create-only, so two writers can never both land on one key; `head` tells a retry whether its
own output is already there (then nothing is paid again) or another job's is (a conflict).
"""

import errno
import itertools
import json
import os
import re
import stat
from dataclasses import dataclass, replace
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


# --- keys ------------------------------------------------------------------------------------------------

# The one rule for output keys (the API's `output_key`, references, and every store): a relative key of
# letters, digits and !_.*'()- in parts separated by single '/', no part starting with '.' (so no key can
# climb out of its place or name the file store's own metadata files, which start with a dot).
_KEY_CHARS = re.compile(r"[A-Za-z0-9!_.*'()/\-]+")
# What a client may name. A key must fit every store: S3 allows 1,024 bytes in all, and the store puts
# the client's prefix (`clients/<uuid>/`, 45 characters) and its own configured prefix in front; the
# file store keeps `.<part>.payonce.json` beside each object, within Linux's 255-byte NAME_MAX.
KEY_MAX_CHARS = 900
PART_MAX_CHARS = 200
STORE_KEY_MAX_CHARS = 1024


def key_problem(key, *, max_chars: int = KEY_MAX_CHARS) -> str | None:
    """Why `key` is not a valid output key, in words, or None if it is."""
    if not isinstance(key, str) or not key:
        return "An output key is a non-empty string."
    if len(key) > max_chars:
        return f"An output key has at most {max_chars} characters."
    if not _KEY_CHARS.fullmatch(key):
        return "An output key uses only letters, digits, '/' and !_.*'()-."
    parts = key.split("/")
    if any(not part or part.startswith(".") for part in parts):
        return "An output key is relative, its parts separated by single '/', no part starting with '.'."
    if any(len(part) > PART_MAX_CHARS for part in parts):
        return f"Each part of an output key between '/' has at most {PART_MAX_CHARS} characters."
    return None


def check_key(key, *, max_chars: int = STORE_KEY_MAX_CHARS) -> None:
    """Raise ValueError unless `key` is a valid key (every store checks again what it is given)."""
    problem = key_problem(key, max_chars=max_chars)
    if problem:
        raise ValueError(f"output key {key!r:.80}: {problem}")


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
        check_key(key)  # validated at submit; checked again here, lexically
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
            found = os.stat(data)
        except FileNotFoundError:
            return StoredObject(key, None, info.get("content_type", ""), info["metadata"], complete=False)
        if not stat.S_ISREG(found.st_mode):  # a directory (or device) where the bytes belong: never "ours"
            raise IsADirectoryError(errno.EISDIR, "not a regular file", data)
        return StoredObject(key, found.st_size, info.get("content_type", ""), info["metadata"])

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
        if not self._link_new(data, payload, durable=True):
            # Another execution of this same job completed the claim a moment before: its bytes stand.
            # Anything else in the way is an error, never a success with no bytes behind it.
            existing = self.head(key)
            if existing is None or not existing.complete or existing.written_by != metadata.get("written_by"):
                raise FileExistsError(errno.EEXIST, "something else is at the object's path", data)
            return existing
        return StoredObject(key, len(payload), content_type, metadata)

    def open(self, key: str):
        data, _ = self._paths(key)
        return open(data, "rb")

    def presigned_url(self, key: str) -> str | None:
        return None  # served by the API (GET /v1/jobs/{id}/output)


class ClientStore:
    """One client's part of the store (docs/design.md, "The output key: read back before paying": keys
    belong to a client). Every key a client names lives under `clients/<client id>/`, so no client can read,
    write, block or learn of another's keys, whatever key it names; `StoredObject.key` is the key as the
    client named it."""

    def __init__(self, store, client_id):
        self.store = store
        self.prefix = f"clients/{client_id}/"

    def _key(self, key: str) -> str:
        check_key(key, max_chars=KEY_MAX_CHARS)
        return self.prefix + key

    def _own(self, stored: StoredObject, key: str) -> StoredObject:
        return replace(stored, key=key)

    def head(self, key: str) -> StoredObject | None:
        stored = self.store.head(self._key(key))
        return self._own(stored, key) if stored is not None else None

    def put(self, key: str, payload: bytes, *, content_type: str, metadata: dict) -> StoredObject:
        try:
            stored = self.store.put(self._key(key), payload, content_type=content_type, metadata=metadata)
        except OutputKeyTaken as taken:
            raise OutputKeyTaken(self._own(taken.existing, key)) from None
        return self._own(stored, key)

    def open(self, key: str):
        return self.store.open(self._key(key))

    def presigned_url(self, key: str) -> str | None:
        return self.store.presigned_url(self._key(key))


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
        from executor.s3store import S3Store  # boto3 is loaded only where the store is S3

        return S3Store.from_url(url)
    raise ValueError(f"OUTPUT_STORE_URL: unsupported scheme {parts.scheme!r} (file:// or s3://)")


def get_store():
    """The whole store. The executor and the API reach it only through `client_store`."""
    return _store_for(settings.OUTPUT_STORE_URL)


def client_store(client_id) -> ClientStore:
    return ClientStore(get_store(), client_id)
