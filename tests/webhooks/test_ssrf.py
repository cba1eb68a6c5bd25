"""The SSRF guard (webhooks/ssrf.py): refusals before any connection, pinned addresses, no redirects,
bounded bodies and timeouts. Real sockets on loopback; DNS is faked (every test), so no lookup leaves the
machine and each resolution is counted."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import time

import pytest
import urllib3.connection

from tests.support.http_receiver import Listener, Receiver, Trickler
from tests.support.procs import free_port
from webhooks import ssrf

PUBLIC_V4 = "93.184.215.14"
PUBLIC_V6 = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"


class FakeDNS:
    """Stands in for socket.getaddrinfo: names map to address lists; anything else does not resolve."""

    def __init__(self):
        self.records: dict[str, list[str]] = {}
        self.calls: list[str] = []

    def __call__(self, host, port, family=0, type=0, proto=0, flags=0):
        self.calls.append(host)
        if host not in self.records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        port = int(port or 0)
        answers = []
        for ip in self.records[host]:
            if ":" in ip:
                answers.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0)))
            else:
                answers.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)))
        return answers


@pytest.fixture(autouse=True)
def dns(monkeypatch):
    fake = FakeDNS()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture
def no_connect(monkeypatch):
    """Fail (and record) any attempt to open a connection, at every level a client could use."""
    attempts = []

    def forbid(name):
        def refuse(*args, **kwargs):
            attempts.append(name)
            raise AssertionError(f"{name} was called for a refused target")

        return refuse

    monkeypatch.setattr(socket.socket, "connect", forbid("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", forbid("socket.connect_ex"))
    monkeypatch.setattr(socket, "create_connection", forbid("socket.create_connection"))
    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", forbid("urllib3 connect"))
    return attempts


@pytest.fixture
def private_refused(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = False


@pytest.fixture
def private_allowed(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True


# --- refused before any connection -----------------------------------------------------------------

PRIVATE_TARGETS = [
    # (url with {port}, DNS records for its host or None for a literal)
    ("http://10.0.0.1:{port}/", None),
    ("http://172.16.5.4:{port}/", None),
    ("http://192.168.1.1:{port}/", None),
    ("http://127.0.0.1:{port}/", None),
    ("http://169.254.169.254:{port}/latest/meta-data", None),
    ("http://[::1]:{port}/", None),
    ("http://100.64.0.1:{port}/", None),
    ("http://0.0.0.0:{port}/", None),
    ("http://2130706433:{port}/", None),
    ("http://0x7f.1:{port}/", None),
    ("http://0x7f000001:{port}/", None),
    ("http://0177.0.0.1:{port}/", None),
    ("http://127.1:{port}/", None),
    ("http://[::ffff:127.0.0.1]:{port}/", None),
    ("http://[::ffff:a9fe:a9fe]:{port}/", None),  # 169.254.169.254, mapped, in hex
    ("http://[fd00::1]:{port}/", None),
    ("http://[fe80::1]:{port}/", None),
    ("http://[::]:{port}/", None),
    ("http://[ff02::1]:{port}/", None),
    ("http://224.0.0.1:{port}/", None),
    ("http://255.255.255.255:{port}/", None),
    ("http://240.0.0.1:{port}/", None),
    ("http://[64:ff9b::7f00:1]:{port}/", None),  # NAT64 of 127.0.0.1
    ("http://[2002:7f00:1::]:{port}/", None),  # 6to4 of 127.0.0.1
    ("http://internal.example.com:{port}/", ["127.0.0.1"]),
    ("http://localhost:{port}/", ["::1", "127.0.0.1"]),
    ("http://mixed.example.com:{port}/", [PUBLIC_V4, "10.1.2.3"]),  # ANY private address refuses
    ("http://mixed6.example.com:{port}/", [PUBLIC_V4, PUBLIC_V6, "fd12::7"]),
    ("http://metadata.example.com:{port}/", ["169.254.169.254"]),
    ("http://mapped.example.com:{port}/", ["::ffff:10.0.0.1"]),
]


@pytest.mark.parametrize("url, records", PRIVATE_TARGETS, ids=[u for u, _ in PRIVATE_TARGETS])
def test_private_targets_are_refused_before_any_connection(url, records, dns, private_refused):
    with Listener() as listener:  # every URL points at its port: a local one would reach it
        url = url.format(port=listener.port)
        host = url.split("//")[1].split(":")[0]
        if records:
            dns.records[host] = records

        with pytest.raises(ssrf.Refused) as refused:
            ssrf.check_url(url)
        assert refused.value.reason == "private_address"

        with pytest.MonkeyPatch.context() as mp:  # the same refusal from post, with every connect forbidden
            attempts = []
            mp.setattr(socket.socket, "connect", lambda *a: attempts.append(a))
            mp.setattr(socket, "create_connection", lambda *a, **k: attempts.append(a))
            mp.setattr(urllib3.connection.HTTPConnection, "connect", lambda *a: attempts.append(a))
            with pytest.raises(ssrf.Refused) as refused:
                ssrf.post(url, b"{}", {"content-type": "application/json"})
            assert refused.value.reason == "private_address"
            assert attempts == []

        assert listener.connections() == 0
        # a literal is judged without asking DNS; a name is resolved exactly once per call
        assert dns.calls == ([] if records is None else [host, host])


@pytest.mark.parametrize(
    "url, reason",
    [
        ("ftp://example.com/", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("gopher://example.com:70/", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("//example.com/hook", "scheme"),
        ("example.com/hook", "scheme"),
        ("http://user:pw@example.com/", "userinfo"),
        ("http://user@example.com/", "userinfo"),
        ("http://example.com@10.0.0.1/", "userinfo"),
        ("http://example.com:0/", "port"),
        ("http://example.com:65536/", "port"),
        ("http://example.com:http/", "port"),
        ("http:///hook", "no_host"),
        ("http://", "no_host"),
        ("https://:443/", "no_host"),
        ("", "syntax"),
        ("http://exa mple.com/", "syntax"),
        ("http://example.com/\r\nX-Injected: 1", "syntax"),
        ("http://[::1/", "syntax"),
        ("http://exa%6dple.com/", "syntax"),
    ],
)
def test_bad_urls_are_refused_even_when_private_targets_are_allowed(url, reason, dns, no_connect, private_allowed):
    with pytest.raises(ssrf.Refused) as refused:
        ssrf.check_url(url)
    assert refused.value.reason == reason
    with pytest.raises(ssrf.Refused) as refused:
        ssrf.post(url, b"{}", {})
    assert refused.value.reason == reason
    assert dns.calls == []  # refused on syntax alone
    assert no_connect == []


def test_a_name_that_does_not_resolve_is_refused(dns, no_connect, private_allowed):
    with pytest.raises(ssrf.Refused) as refused:
        ssrf.check_url("https://nowhere.invalid/hook")
    assert refused.value.reason == "resolve_failed"
    dns.records["empty.example.com"] = []
    with pytest.raises(ssrf.Refused) as refused:
        ssrf.post("https://empty.example.com/hook", b"", {})
    assert refused.value.reason == "resolve_failed"
    assert no_connect == []


def test_public_names_pass_and_are_resolved_once(dns, no_connect, private_refused):
    dns.records["hooks.example.com"] = [PUBLIC_V4, PUBLIC_V6]
    ssrf.check_url("https://hooks.example.com/hooks/payonce")
    ssrf.check_url(f"http://[{PUBLIC_V6}]:8080/")
    ssrf.check_url("http://8.8.8.8/")
    ssrf.check_url("http://[64:ff9b::808:808]/")  # NAT64 of a public address
    assert dns.calls == ["hooks.example.com"]
    assert no_connect == []


def test_allow_private_argument_overrides_the_setting(dns, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    with pytest.raises(ssrf.Refused):
        ssrf.check_url("http://127.0.0.1/", allow_private=False)
    settings.WEBHOOK_ALLOW_PRIVATE = False
    ssrf.check_url("http://127.0.0.1/", allow_private=True)
    with pytest.raises(ssrf.Refused):
        ssrf.check_url("http://127.0.0.1/")


@pytest.mark.parametrize(
    "address",
    [
        "0.0.0.0", "0.1.2.3", "10.255.255.255", "100.127.255.254", "127.8.8.8", "169.254.0.1", "172.31.0.1",
        "192.0.0.8", "192.0.2.1", "192.88.99.1", "192.168.0.1", "198.18.0.1", "203.0.113.9", "224.0.0.251",
        "239.255.255.250", "240.0.0.1", "255.255.255.255", "::", "::1", "::127.0.0.1", "::ffff:0.0.0.0",
        "::ffff:192.168.0.1", "64:ff9b::a00:1", "64:ff9b:1::1", "2002:a00:1::1", "2001::1", "2001:db8::1",
        "fc00::1", "fdff::1", "fe80::1", "febf::1", "fec0::1", "ff02::1", "100::1",
    ],
)
def test_forbidden_addresses(address):
    assert ssrf.forbidden(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", PUBLIC_V4, "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", PUBLIC_V6]
)
def test_public_addresses(address):
    assert not ssrf.forbidden(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "literal, address",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1.258", "10.1.1.2"),
        ("169.254.43518", "169.254.169.254"),
        ("127.0.0.1.", "127.0.0.1"),
        ("example.com", None),
        ("1.2.3.4.5", None),
        ("256.1.1.1", None),
        ("4294967296", None),
        ("08.1.1.1", None),
        ("1e3", None),
    ],
)
def test_ipv4_literal_forms(literal, address):
    parsed = ssrf.parse_ipv4_literal(literal)
    assert (str(parsed) if parsed else None) == address


# --- sending -----------------------------------------------------------------------------------------


def test_pinned_address_and_original_host_header(dns, private_allowed):
    """A public-looking name resolving to 127.0.0.1, private allowed: the request reaches the local
    server, with Host: the original name, after exactly one resolution."""
    with Receiver(status=204, body=b"") as receiver:
        dns.records["hooks.example.com"] = ["127.0.0.1"]
        answer = ssrf.post(
            f"http://hooks.example.com:{receiver.port}/hooks/payonce?tenant=7#frag",
            b'{"id": "j:1:generation.succeeded"}',
            {"content-type": "application/json", "webhook-id": "j:1:generation.succeeded", "Host": "evil.test"},
        )
    assert answer.status == 204
    assert dns.calls == ["hooks.example.com"]
    [request] = receiver.requests
    assert request.method == "POST"
    assert request.target == "/hooks/payonce?tenant=7"
    assert request.headers["host"] == f"hooks.example.com:{receiver.port}"
    assert request.headers["webhook-id"] == "j:1:generation.succeeded"
    assert request.headers["content-type"] == "application/json"
    assert request.body == b'{"id": "j:1:generation.succeeded"}'
    assert answer.elapsed_ms >= 0


def test_allow_private_argument_reaches_loopback_with_setting_off(dns, private_refused):
    with Receiver() as receiver:
        answer = ssrf.post(receiver.url, b"x", {}, allow_private=True)
        with pytest.raises(ssrf.Refused):
            ssrf.post(receiver.url, b"x", {})
    assert answer.status == 200 and answer.body == b"ok"
    assert len(receiver.requests) == 1


def test_next_vetted_address_is_tried_when_the_first_does_not_connect(dns, private_allowed):
    with Receiver() as receiver:  # listens on 127.0.0.1 only: 127.0.0.2 refuses the connection
        dns.records["multi.example.com"] = ["127.0.0.2", "127.0.0.1"]
        answer = ssrf.post(f"http://multi.example.com:{receiver.port}/", b"x", {})
    assert answer.status == 200
    assert len(receiver.requests) == 1
    assert dns.calls == ["multi.example.com"]


def test_ipv6_literal(dns, private_allowed):
    receiver = Receiver(host="::1")  # this machine has IPv6 loopback (Redis listens on it too)
    with receiver:
        answer = ssrf.post(f"http://[::1]:{receiver.port}/v6", b"x", {})
    assert answer.status == 200
    assert receiver.requests[0].headers["host"] == f"[::1]:{receiver.port}"
    assert dns.calls == []


def test_redirects_are_not_followed(private_allowed):
    with Receiver() as elsewhere, Receiver(status=302, headers={"Location": elsewhere.url}) as receiver:
        answer = ssrf.post(receiver.url, b"x", {})
    assert answer.status == 302
    assert answer.headers["location"] == elsewhere.url
    assert elsewhere.requests == []
    assert len(receiver.requests) == 1


def test_error_statuses_are_answers_not_exceptions(private_allowed):
    with Receiver(status=500, body=b"boom") as receiver:
        answer = ssrf.post(receiver.url, b"x", {})
    assert (answer.status, answer.body) == (500, b"boom")


def test_header_names_are_lower_case(private_allowed):
    with Receiver(headers={"X-Custom-Thing": "Value", "Content-Type": "text/plain"}) as receiver:
        answer = ssrf.post(receiver.url, b"x", {})
    assert answer.headers["x-custom-thing"] == "Value"
    assert answer.headers["content-type"] == "text/plain"
    assert all(name == name.lower() for name in answer.headers)


def test_a_large_body_is_cut_to_64_kb(private_allowed):
    body = bytes(range(256)) * 4096  # 1 MB
    with Receiver(body=body) as receiver:
        answer = ssrf.post(receiver.url, b"x", {})
        small = ssrf.post(receiver.url, b"x", {}, max_body=1000)
    assert answer.status == 200
    assert answer.body == body[:65536]
    assert small.body == body[:1000]


def test_a_silent_receiver_hits_the_read_timeout(private_allowed):
    with Listener() as listener:  # the connection is accepted by the kernel; nobody ever answers
        started = time.monotonic()
        with pytest.raises(ssrf.SendError) as failed:
            ssrf.post(f"http://127.0.0.1:{listener.port}/", b"x", {}, read_timeout=0.5)
        assert time.monotonic() - started < 3
        assert listener.connections() == 1
    assert failed.value.message


def test_a_trickling_receiver_hits_the_deadline(private_allowed):
    """One byte every 0.1 s never trips a per-read timeout; the whole-exchange deadline still does."""
    with Trickler(pause=0.1) as trickler:
        started = time.monotonic()
        with pytest.raises(ssrf.SendError) as failed:
            ssrf.post(f"http://127.0.0.1:{trickler.port}/", b"x", {}, read_timeout=0.8)
        assert time.monotonic() - started < 3
    assert "within" in failed.value.message


def test_a_closed_port_is_a_send_error(private_allowed):
    port = free_port()  # nothing listens there
    with pytest.raises(ssrf.SendError):
        ssrf.post(f"http://127.0.0.1:{port}/", b"x", {})


# --- https: SNI and certificate checked against the original name, connection to the pinned address ---


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A CA and a certificate for hooks.example.com signed by it (files, paths returned)."""
    import cryptography  # noqa: F401  (installed with moto[server]; a missing one is a failure, not a skip)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject, issuer, public_key, signing_key, *, ca, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()), critical=False
            )
        return builder.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = build("payonce test CA", "payonce test CA", ca_key.public_key(), ca_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = build("hooks.example.com", "payonce test CA", leaf_key.public_key(), ca_key, ca=False, san="hooks.example.com")

    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (directory / "leaf.pem").write_bytes(leaf.public_bytes(pem))
    (directory / "leaf.key").write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return directory


@pytest.fixture
def tls_receiver(tls, monkeypatch):
    monkeypatch.setattr(ssrf, "CA_CERTS", str(tls / "ca.pem"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls / "leaf.pem", tls / "leaf.key")
    server_names = []
    context.sni_callback = lambda sslobj, name, ctx: server_names.append(name)
    with Receiver(ssl_context=context) as receiver:
        receiver.server_names = server_names
        yield receiver


def test_https_verifies_the_original_name_on_the_pinned_address(dns, tls_receiver, private_allowed):
    dns.records["hooks.example.com"] = ["127.0.0.1"]
    answer = ssrf.post(f"https://hooks.example.com:{tls_receiver.port}/hook", b"x", {})
    assert answer.status == 200
    assert tls_receiver.server_names == ["hooks.example.com"]
    assert tls_receiver.requests[0].headers["host"] == f"hooks.example.com:{tls_receiver.port}"
    assert dns.calls == ["hooks.example.com"]


def test_https_refuses_a_certificate_for_another_name(dns, tls_receiver, private_allowed):
    dns.records["other.example.com"] = ["127.0.0.1"]
    with pytest.raises(ssrf.SendError) as failed:
        ssrf.post(f"https://other.example.com:{tls_receiver.port}/hook", b"x", {})
    assert "other.example.com" in failed.value.message
    assert tls_receiver.requests == []


# --- a session: a batch of posts over one vetted, kept-alive connection --------------------------------


def test_a_session_resolves_once_and_reuses_one_pinned_connection(dns):
    from tests.support.webhook_receiver import WebhookReceiver

    with WebhookReceiver() as receiver:  # keeps connections alive, like most receivers
        port = receiver.server.server_address[1]
        dns.records["hooks.example.com"] = ["127.0.0.1"]
        with ssrf.Session(allow_private=True) as session:
            answers = [session.post(f"http://hooks.example.com:{port}/hooks?n={n}", b"{}", {"webhook-id": str(n)})
                       for n in range(3)]
        assert [a.status for a in answers] == [200, 200, 200]
        assert dns.calls == ["hooks.example.com"]  # vetted once for the whole batch
        assert len({r.peer for r in receiver.requests}) == 1  # one TCP connection, kept alive
        assert [r.path for r in receiver.requests] == [f"/hooks?n={n}" for n in range(3)]
        assert {r.headers["host"] for r in receiver.requests} == {f"hooks.example.com:{port}"}


def test_a_session_refuses_a_private_origin_before_connecting(dns, no_connect):
    dns.records["inside.example.com"] = ["10.1.2.3"]
    with ssrf.Session(allow_private=False) as session:
        with pytest.raises(ssrf.Refused) as refused:
            session.post("http://inside.example.com/hooks", b"{}", {})
    assert refused.value.reason == "private_address"
    assert no_connect == []
