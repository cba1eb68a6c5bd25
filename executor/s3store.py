"""The S3 output store (docs/design.md, "The output key: read back before paying"): `FileStore`'s interface and
semantics on any S3 API (AWS S3, Cloudflare R2, MinIO, moto), selected by `OUTPUT_STORE_URL=s3://bucket[/prefix]`.

Writes are create-only by a conditional write, `PutObject` with `If-None-Match: *`: the server refuses
it (412 PreconditionFailed, or 409 ConditionalRequestConflict while a concurrent write to the key is in
flight) when the key exists, so two writers can never both land. The refused writer then heads the key:
written by the same job (our own earlier upload, or a retry of a request whose answer was lost), it is
returned as is; written by another job, `OutputKeyTaken`. An S3 object is complete once it exists, so
there is no claim state here (`StoredObject.complete` is always True).

Metadata is kept as S3 user metadata (`x-amz-meta-*`): keys lowercase, values strings. `head` and `put`
return it as the dict `FileStore` returns (written_by, provider, model, attempt), with every value a
`str` (an int attempt comes back as "2"). Values must be ASCII (S3 sends them in HTTP headers).

Configuration comes from the standard AWS environment: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or any
other source in boto3's credential chain), AWS_DEFAULT_REGION (default us-east-1), and AWS_ENDPOINT_URL
(or AWS_ENDPOINT_URL_S3) for R2 / MinIO / moto, which also switches to path-style addressing. The
credentials need s3:GetObject, s3:PutObject and s3:ListBucket: without ListBucket, S3 answers a HEAD of a
missing key with 403 instead of 404, and `head` raises rather than report an absent key.
"""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from executor.store import OutputKeyTaken, StoredObject, check_key

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
MAX_ATTEMPTS = 3  # boto3's standard retry mode, first try included (botocore's `max_attempts` counts retries)
PRESIGNED_TTL_S = 3600

# The server's answers to a conditional write on a key that exists (or is being written right now).
_KEY_EXISTS = {"PreconditionFailed", "412"}
_CONCURRENT_WRITE = {"ConditionalRequestConflict", "409"}
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_PUT_TRIES = 4  # conditional writes refused by a write that then vanished (409 then absent): try again


def _error_code(exc) -> str:
    error = exc.response.get("Error", {})
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def _status(exc) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


class S3Store:
    """Objects at `s3://bucket/<prefix><key>`; `StoredObject.key` is the key as given, without the prefix."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region_name: str | None = None):
        if not bucket:
            raise ValueError("S3Store: a bucket is required")
        self.bucket = bucket
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint_url = endpoint_url or None
        self.region_name = region_name or "us-east-1"
        self._client = None
        self._client_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> "S3Store":
        """`s3://bucket[/prefix]`, endpoint and region from the environment."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"OUTPUT_STORE_URL: {url!r} is not s3://bucket[/prefix]")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return cls(parts.netloc, parts.path, endpoint_url=endpoint,
                   region_name=os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Store(s3://{self.bucket}/{self.prefix}{where})"

    @property
    def client(self):
        """One boto3 client per store, made on first use (clients are thread-safe; sessions are not, so
        the store makes its own session under a lock)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    config = Config(
                        connect_timeout=CONNECT_TIMEOUT_S,
                        read_timeout=READ_TIMEOUT_S,
                        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
                        signature_version="s3v4",
                        # Custom endpoints (MinIO, moto, R2) are addressed by path, not by bucket host.
                        s3={"addressing_style": "path"} if self.endpoint_url else None,
                    )
                    self._client = boto3.session.Session().client(
                        "s3", region_name=self.region_name, endpoint_url=self.endpoint_url, config=config
                    )
        return self._client

    def _object_key(self, key: str) -> str:
        check_key(key)
        return self.prefix + key

    def head(self, key: str) -> StoredObject | None:
        try:
            answer = self.client.head_object(Bucket=self.bucket, Key=self._object_key(key))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND or _status(exc) == 404:
                return None
            raise
        return StoredObject(key, answer.get("ContentLength"), answer.get("ContentType") or "",
                            dict(answer.get("Metadata") or {}))

    def put(self, key: str, payload: bytes, *, content_type: str, metadata: dict) -> StoredObject:
        """Create-only write. Raises OutputKeyTaken if another job wrote the key; returns the existing
        object if this job (metadata["written_by"]) did."""
        object_key = self._object_key(key)
        meta = _s3_metadata(metadata)
        for attempt in range(_PUT_TRIES):
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=object_key, Body=payload, ContentType=content_type,
                    Metadata=meta, IfNoneMatch="*",
                )
                return StoredObject(key, len(payload), content_type, meta)
            except ClientError as exc:
                code = _error_code(exc)
                if code not in (_KEY_EXISTS | _CONCURRENT_WRITE) and _status(exc) not in (409, 412):
                    raise
            existing = self.head(key)
            if existing is not None:
                if existing.written_by != meta.get("written_by"):
                    raise OutputKeyTaken(existing)
                return existing  # our own earlier write landed: a completed upload is idempotent
            # Refused, yet nothing is there: the write we raced failed or was deleted. Try again.
            time.sleep(0.05 * (attempt + 1))
        raise OutputKeyTaken(StoredObject(key, None, "", {}, complete=False))

    def open(self, key: str):
        """A readable binary file-like object (botocore's StreamingBody, an io.IOBase: read, iteration,
        close, `with`). FileNotFoundError if the key is absent, as FileStore."""
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._object_key(key))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND or _status(exc) == 404:
                raise FileNotFoundError(f"output key {key!r} not in {self!r}") from exc
            raise
        return answer["Body"]

    def presigned_url(self, key: str) -> str:
        """A GET URL for the object, valid for an hour (signed locally: no request is made)."""
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._object_key(key)}, ExpiresIn=PRESIGNED_TTL_S
        )


def _s3_metadata(metadata: dict) -> dict:
    """S3 user metadata: lowercase keys, ASCII string values (what `head` will give back)."""
    meta = {}
    for name, value in metadata.items():
        name, value = str(name).lower(), "" if value is None else str(value)
        if not name.isascii() or not value.isascii():
            raise ValueError(f"output metadata {name}={value!r}: S3 metadata must be ASCII")
        meta[name] = value
    return meta
