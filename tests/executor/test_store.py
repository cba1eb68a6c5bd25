"""The output stores (docs/design.md, "The output key: read back before paying"): FileStore and S3Store hold the same
contract, proven by the same tests on both. S3Store talks HTTP to moto's standalone server, a real process
(tests/support)."""

import threading
import uuid

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

from executor import store as store_module
from executor.s3store import S3Store
from executor.store import FileStore, OutputKeyTaken, get_store
from tests.support.moto_server import MotoServer

BUCKET = "payonce-test-outputs"
REGION = "us-east-1"


def meta(job: str, attempt: int = 1) -> dict:
    """What the executor writes (executor/services.py); values as strings, as S3 gives them back."""
    return {"written_by": job, "provider": "sandbox", "model": "sandbox-image", "attempt": f"payonce-{job}-{attempt}"}


@pytest.fixture(scope="module")
def aws_env():
    """Dummy credentials for moto, and nothing from a developer's own AWS setup."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_DEFAULT_REGION", REGION)
        patch.setenv("AWS_CONFIG_FILE", "/dev/null")
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def moto(aws_env):
    """moto's S3 server as a process on a free loopback port, with the test bucket created."""
    server = MotoServer().start()
    try:
        raw_client(server.url).create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def raw_client(url: str):
    """A plain boto3 client on the moto server, to look behind the store's back."""
    return boto3.client("s3", endpoint_url=url, region_name=REGION, config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def s3_store(moto):
    """An S3Store on its own prefix of the shared bucket, so tests never see each other's keys."""
    return S3Store(BUCKET, f"t-{uuid.uuid4().hex[:12]}", endpoint_url=moto.url, region_name=REGION)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.e2e)])  # s3: a moto server process
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "outputs")
    return request.getfixturevalue("s3_store")


def read(store, key: str) -> bytes:
    with store.open(key) as handle:
        return handle.read()


# The contract, on both stores.


def test_absent_key_heads_none(store):
    assert store.head("outputs/nobody/image.png") is None


def test_put_then_head_returns_metadata_and_size(store):
    payload = b"\x89PNG one"
    stored = store.put("outputs/job-1/image.png", payload, content_type="image/png", metadata=meta("job-1"))
    assert (stored.key, stored.size, stored.content_type, stored.complete) == (
        "outputs/job-1/image.png", len(payload), "image/png", True)
    assert stored.metadata == meta("job-1") and stored.written_by == "job-1"
    assert store.head("outputs/job-1/image.png") == stored


def test_open_reads_the_bytes_back(store):
    payload = bytes(range(256)) * 1000  # binary, 256 kB
    store.put("outputs/job-1/video.mp4", payload, content_type="video/mp4", metadata=meta("job-1"))
    assert read(store, "outputs/job-1/video.mp4") == payload


def test_open_absent_key_raises_file_not_found(store):
    with pytest.raises(FileNotFoundError):
        store.open("outputs/nobody/image.png")


def test_same_job_again_gets_the_existing_object_and_no_second_write(store):
    first = store.put("outputs/job-1/image.png", b"first", content_type="image/png", metadata=meta("job-1", 1))
    # A retry of the same job (another attempt, other bytes): the completed upload stands.
    again = store.put("outputs/job-1/image.png", b"second, longer", content_type="image/webp",
                      metadata=meta("job-1", 2))
    assert again == first == store.head("outputs/job-1/image.png")
    assert again.size == 5 and again.metadata["attempt"] == "payonce-job-1-1"
    assert read(store, "outputs/job-1/image.png") == b"first"


def test_another_job_gets_output_key_taken_and_the_object_is_unchanged(store):
    first = store.put("outputs/shared.png", b"job one's", content_type="image/png", metadata=meta("job-1"))
    with pytest.raises(OutputKeyTaken) as taken:
        store.put("outputs/shared.png", b"job two's bytes", content_type="image/png", metadata=meta("job-2"))
    assert taken.value.existing.written_by == "job-1"
    assert store.head("outputs/shared.png") == first
    assert store.head("outputs/shared.png").metadata == meta("job-1")
    assert read(store, "outputs/shared.png") == b"job one's"


@pytest.mark.parametrize("round_", range(3))
def test_racing_writers_exactly_one_lands(store, round_):
    key = f"outputs/race-{round_}/image.png"
    writers = 8
    barrier = threading.Barrier(writers)
    won, taken, errors = [], [], []

    def write(n: int) -> None:
        job = f"job-{n}"
        payload = f"written by {job} ".encode() * (n + 1)  # each writer's bytes differ, in length too
        barrier.wait()
        try:
            won.append((job, payload, store.put(key, payload, content_type="image/png", metadata=meta(job))))
        except OutputKeyTaken as exc:
            taken.append(exc.existing)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert len(won) == 1, f"{len(won)} writers landed on one key: {[job for job, _, _ in won]}"
    assert len(taken) == writers - 1
    job, payload, stored = won[0]
    assert all(existing.written_by == job for existing in taken)
    assert store.head(key) == stored and stored.written_by == job and stored.size == len(payload)
    assert read(store, key) == payload


def test_nested_keys(store):
    keys = ["outputs/job-1/frames/0001.png", "outputs/job-1/frames/0002.png", "outputs/job-1/a/b/c/d.bin"]
    for n, key in enumerate(keys):
        store.put(key, f"frame {n}".encode(), content_type="image/png", metadata=meta("job-1"))
    for n, key in enumerate(keys):
        assert store.head(key).size == len(f"frame {n}")
        assert read(store, key) == f"frame {n}".encode()
    assert store.head("outputs/job-1/frames") is None  # a "directory" is no object
    assert store.head("outputs/job-1") is None


INVALID_KEYS = ["/outputs/abs.png", "outputs//image.png", "outputs/", "", ".hidden", "outputs/.image.png",
                "outputs/../escape.png", "outputs/./image.png", "outputs/a\x00b.png"]


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_invalid_keys_are_rejected(store, key):
    with pytest.raises(ValueError):
        store.head(key)
    with pytest.raises(ValueError):
        store.put(key, b"x", content_type="image/png", metadata=meta("job-1"))
    with pytest.raises(ValueError):
        store.open(key)


# S3 only.


@pytest.mark.e2e
def test_s3_conditional_write_reaches_the_server(s3_store, moto):
    """The refusal comes from the server, on If-None-Match: *, not from a check in our code: if moto did
    not honour the condition, the second write would land and this test fails."""
    sent, answered = [], []
    events = s3_store.client.meta.events
    events.register("before-send.s3.PutObject", lambda request, **_: sent.append(request.headers.get("If-None-Match")))
    events.register("after-call.s3.PutObject", lambda http_response, **_: answered.append(http_response.status_code))

    s3_store.put("outputs/job-1/image.png", b"job one's", content_type="image/png", metadata=meta("job-1"))
    with pytest.raises(OutputKeyTaken):
        s3_store.put("outputs/job-1/image.png", b"job two's", content_type="image/png", metadata=meta("job-2"))
    s3_store.put("outputs/job-1/image.png", b"job one again", content_type="image/png", metadata=meta("job-1"))

    assert [value.decode() if isinstance(value, bytes) else value for value in sent] == ["*", "*", "*"]
    assert answered == [200, 412, 412], "moto did not refuse a conditional write on an existing key"

    # Behind the store's back: the same conditional request is refused, and only the condition makes the
    # difference (an unconditional overwrite of another key goes through).
    raw = raw_client(moto.url)
    object_key = s3_store.prefix + "outputs/job-1/image.png"
    with pytest.raises(ClientError) as refused:
        raw.put_object(Bucket=BUCKET, Key=object_key, Body=b"overwrite", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert raw.get_object(Bucket=BUCKET, Key=object_key)["Body"].read() == b"job one's"
    control = s3_store.prefix + "control.bin"
    raw.put_object(Bucket=BUCKET, Key=control, Body=b"one")
    raw.put_object(Bucket=BUCKET, Key=control, Body=b"two")
    assert raw.get_object(Bucket=BUCKET, Key=control)["Body"].read() == b"two"


@pytest.mark.e2e
def test_s3_object_carries_the_metadata_as_user_metadata(s3_store, moto):
    s3_store.put("outputs/job-7/image.png", b"png", content_type="image/png",
                 metadata={"written_by": "job-7", "provider": "sandbox", "model": "m", "attempt": 2})
    answer = raw_client(moto.url).head_object(Bucket=BUCKET, Key=s3_store.prefix + "outputs/job-7/image.png")
    assert answer["Metadata"] == {"written_by": "job-7", "provider": "sandbox", "model": "m", "attempt": "2"}
    assert answer["ContentType"] == "image/png"
    # Values come back as strings: an int attempt is "2".
    assert s3_store.head("outputs/job-7/image.png").metadata["attempt"] == "2"


@pytest.mark.e2e
def test_s3_presigned_url_serves_the_bytes_over_http(s3_store):
    payload = b"\x00\x01 some media \xff" * 100
    s3_store.put("outputs/job-1/clip.mp4", payload, content_type="video/mp4", metadata=meta("job-1"))
    url = s3_store.presigned_url("outputs/job-1/clip.mp4")
    assert url.startswith("http://127.0.0.1:") and "X-Amz-Expires=3600" in url
    answer = requests.get(url, timeout=10)  # no credentials: the signature in the URL is all there is
    assert answer.status_code == 200, answer.text
    assert answer.content == payload
    assert answer.headers["Content-Type"] == "video/mp4"


@pytest.fixture
def fresh_store_cache():
    store_module._store_for.cache_clear()
    yield
    store_module._store_for.cache_clear()


@pytest.mark.e2e
def test_get_store_builds_an_s3store_from_settings(settings, monkeypatch, moto, fresh_store_cache):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    settings.OUTPUT_STORE_URL = f"s3://{BUCKET}/payonce/outputs"

    built = get_store()
    assert isinstance(built, S3Store) and get_store() is built
    assert (built.bucket, built.prefix, built.endpoint_url, built.region_name) == (
        BUCKET, "payonce/outputs/", moto.url, REGION)
    config = built.client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (5, 30)
    assert config.retries["mode"] == "standard"
    assert config.retries.get("total_max_attempts", config.retries.get("max_attempts")) == 3
    assert config.s3["addressing_style"] == "path"

    built.put("outputs/job-9/image.png", b"via settings", content_type="image/png", metadata=meta("job-9"))
    raw = raw_client(moto.url).get_object(Bucket=BUCKET, Key="payonce/outputs/outputs/job-9/image.png")
    assert raw["Body"].read() == b"via settings" and raw["Metadata"]["written_by"] == "job-9"
    assert get_store().head("outputs/job-9/image.png").written_by == "job-9"


def test_s3_url_without_a_bucket_is_refused(settings, fresh_store_cache):
    settings.OUTPUT_STORE_URL = "s3:///just/a/prefix"
    with pytest.raises(ValueError):
        get_store()


# The 409 some S3s (AWS among them) answer while a concurrent conditional write to the key is in flight;
# moto never sends it, so the client is stubbed here (no server).


def stubbed_store():
    from botocore.stub import Stubber

    s3 = S3Store(BUCKET, "p", endpoint_url="http://127.0.0.1:9", region_name=REGION)
    return s3, Stubber(s3.client)


def test_s3_concurrent_write_conflict_then_absent_writes_again(aws_env):
    s3, stub = stubbed_store()
    stub.add_client_error("put_object", "ConditionalRequestConflict", "in flight", 409)
    stub.add_client_error("head_object", "404", "Not Found", 404)
    stub.add_response("put_object", {"ETag": '"e"'})
    with stub:
        stored = s3.put("outputs/job-1/image.png", b"bytes", content_type="image/png", metadata=meta("job-1"))
    stub.assert_no_pending_responses()
    assert stored.written_by == "job-1" and stored.size == 5


def test_s3_concurrent_write_conflict_won_by_another_job(aws_env):
    s3, stub = stubbed_store()
    stub.add_client_error("put_object", "ConditionalRequestConflict", "in flight", 409)
    stub.add_response("head_object", {"ContentLength": 3, "ContentType": "image/png", "Metadata": meta("job-2")})
    with stub, pytest.raises(OutputKeyTaken) as taken:
        s3.put("outputs/job-1/image.png", b"bytes", content_type="image/png", metadata=meta("job-1"))
    assert taken.value.existing.written_by == "job-2"


def test_s3_other_errors_are_not_taken_for_a_conflict(aws_env):
    s3, stub = stubbed_store()
    stub.add_client_error("put_object", "AccessDenied", "no", 403)
    with stub, pytest.raises(ClientError):
        s3.put("outputs/job-1/image.png", b"bytes", content_type="image/png", metadata=meta("job-1"))
