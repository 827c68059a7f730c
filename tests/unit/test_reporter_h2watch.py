"""reporter.h2watch against a real HTTP/2 server over TLS on loopback (h2's server side).

Each test drives the server's side by hand (headers, data, resets, GOAWAY, silence) and
checks what the client's streams, connections and the server saw. Waits are for events, with
a generous cap that only turns a hang into a failure.
"""

from __future__ import annotations

import datetime as dt
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hyperframe.frame
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reporter import h2watch, kubeapi
from reporter.h2watch import H2Pool, H2TransportError, NotHttp2, StreamResetError

CAP = 20.0  # seconds: a hang fails the test instead of blocking the suite


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CAP
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def self_signed(common_name: str) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``localhost`` named ``common_name``, and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cert, key = self_signed("localhost")
    d = tmp_path_factory.mktemp("h2tls")
    (d / "cert.pem").write_bytes(cert)
    (d / "key.pem").write_bytes(key)
    return d / "cert.pem", d / "key.pem"


class ServerConn:
    """One accepted connection: h2's server state, driven by one I/O thread."""

    def __init__(self, sock: ssl.SSLSocket, server: Server) -> None:
        self.sock = sock
        self.server = server
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.lock = threading.Condition()
        self.muted = False
        self.closed = False
        self.requests: dict[int, str] = {}
        self.resets: list[int] = []
        self.raw_out = bytearray()
        self.h2.initiate_connection()
        if server.max_streams is not None:
            self.h2.update_settings(
                {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: server.max_streams}
            )
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            while not self.closed:
                with self.lock:
                    out = self.h2.data_to_send() + bytes(self.raw_out)
                    self.raw_out.clear()
                if out and not self.muted:
                    self.sock.sendall(out)
                if self.muted:
                    time.sleep(0.02)
                    continue
                readable, _, _ = select.select([self.sock], [], [], 0.02)
                if not readable and not self.sock.pending():
                    continue
                data = self.sock.recv(65536)
                if not data:
                    break
                with self.lock:
                    for event in self.h2.receive_data(data):
                        if isinstance(event, h2.events.RequestReceived):
                            path = dict(event.headers)[b":path"].decode()
                            self.requests[event.stream_id] = path
                            self.server.requests.append((self, event.stream_id, path,
                                                         dict(event.headers)))  # fmt: skip
                        elif isinstance(event, h2.events.StreamReset):
                            self.resets.append(event.stream_id)
                    self.lock.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            self.closed = True
            with self.lock:
                self.lock.notify_all()

    def respond(self, stream_id: int, status: int = 200, headers: tuple = ()) -> None:
        with self.lock:
            self.h2.send_headers(stream_id, [(b":status", str(status).encode()), *headers])

    def send(self, stream_id: int, data: bytes, end: bool = False) -> int:
        """Send as much of ``data`` as the client's windows allow now; bytes sent."""
        with self.lock:
            n = min(len(data), self.h2.local_flow_control_window(stream_id))
            sent = 0
            while sent < n:
                size = min(n - sent, self.h2.max_outbound_frame_size)
                self.h2.send_data(stream_id, data[sent : sent + size])
                sent += size
            if end and sent == len(data):
                self.h2.end_stream(stream_id)
            return sent

    def end(self, stream_id: int) -> None:
        with self.lock:
            self.h2.end_stream(stream_id)

    def window(self, stream_id: int | None = None) -> int:
        with self.lock:
            if stream_id is None:
                return self.h2.outbound_flow_control_window
            return self.h2.local_flow_control_window(stream_id)

    def goaway(self, last_stream_id: int) -> None:
        """A graceful GOAWAY, as a Go server sends it: the accepted streams go on (h2's own
        ``close_connection`` would end the server's side at once, so the frame goes raw)."""
        frame = hyperframe.frame.GoAwayFrame(0, last_stream_id=last_stream_id, error_code=0)
        with self.lock:
            self.raw_out += frame.serialize()

    def kill(self) -> None:
        self.closed = True
        self.sock.close()


class Server:
    def __init__(self, tls: tuple[Path, Path], alpn: tuple[str, ...] = ("h2",),
                 max_streams: int | None = None) -> None:  # fmt: skip
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(*map(str, tls))
        self.ctx.set_alpn_protocols(list(alpn))
        self.max_streams = max_streams
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[ServerConn] = []
        self.requests: list[tuple[ServerConn, int, str, dict[bytes, bytes]]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
                sock = self.ctx.wrap_socket(raw, server_side=True)
            except OSError:
                return
            if sock.selected_alpn_protocol() != "h2":
                sock.close()
                continue
            self.conns.append(ServerConn(sock, self))

    def request(self, n: int) -> tuple[ServerConn, int, str, dict[bytes, bytes]]:
        wait_for(lambda: len(self.requests) > n, f"request {n}")
        return self.requests[n]

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            conn.kill()


@pytest.fixture
def server(tls_files: tuple[Path, Path]) -> Iterator[Server]:
    srv = Server(tls_files)
    yield srv
    srv.close()


def configuration(port: int, ca: Path, **extra: Any) -> client.Configuration:
    conf = client.Configuration()
    conf.host = f"https://localhost:{port}"
    conf.ssl_ca_cert = str(ca)
    conf.api_key = {"BearerToken": "Bearer sekret-token"}
    for k, v in extra.items():
        setattr(conf, k, v)
    return conf


@pytest.fixture
def pool(server: Server, tls_files: tuple[Path, Path]) -> Iterator[H2Pool]:
    endpoint = h2watch.endpoint_from(configuration(server.port, tls_files[0]))
    assert endpoint is not None
    p = H2Pool(endpoint, connect_timeout=CAP)
    yield p
    p.close()


def reader(stream: h2watch.H2Stream) -> tuple[list[bytes], list[BaseException], threading.Thread]:
    """Read ``stream`` in a thread: its chunks, and what ended it."""
    chunks: list[bytes] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            chunks.extend(stream.stream())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return chunks, errors, t


def open_stream(
    pool: H2Pool, server: Server, n: int, path: str = "/w"
) -> tuple[h2watch.H2Stream, ServerConn, int]:
    """Open a stream and answer its headers from the server (200)."""
    result: list[h2watch.H2Stream] = []
    t = threading.Thread(target=lambda: result.append(pool.open(path, [], CAP)), daemon=True)
    t.start()
    conn, sid, _, _ = server.request(n)
    conn.respond(sid)
    t.join(CAP)
    assert result, "open did not return"
    return result[0], conn, sid


def test_many_watches_share_one_connection_each_with_its_own_data(
    pool: H2Pool, server: Server
) -> None:
    streams = [open_stream(pool, server, i, f"/w{i}") for i in range(40)]
    assert pool.connections_opened == 1
    assert len(server.conns) == 1
    for i, (_, conn, sid) in enumerate(streams):
        conn.send(sid, f"event-{i}\n".encode(), end=True)
    for i, (stream, _, _) in enumerate(streams):
        assert b"".join(stream.stream()) == f"event-{i}\n".encode()


def test_a_closed_stream_is_reset_at_the_server_and_its_blocked_reader_wakes(
    pool: H2Pool, server: Server
) -> None:
    stream, conn, sid = open_stream(pool, server, 0)
    chunks, errors, t = reader(stream)
    conn.send(sid, b"first\n")
    wait_for(lambda: chunks == [b"first\n"], "the first chunk")
    stream.close()
    t.join(CAP)
    assert not t.is_alive(), "the reader stayed blocked after close"
    assert errors == []  # closed on purpose: the end of the stream, not an error
    wait_for(lambda: sid in conn.resets, "RST_STREAM at the server")


def test_a_stream_nobody_reads_holds_only_its_window_and_does_not_stall_the_others(
    pool: H2Pool, server: Server
) -> None:
    slow, conn, slow_id = open_stream(pool, server, 0)
    fast, _, fast_id = open_stream(pool, server, 1)
    sent = conn.send(slow_id, b"x" * (3 * h2watch.STREAM_WINDOW))
    assert sent == h2watch.STREAM_WINDOW  # the server may send a window's worth, no more
    assert conn.send(fast_id, b"hello\n", end=True) == 6
    assert b"".join(fast.stream()) == b"hello\n"
    # Reading the slow stream gives its window back, so the rest can follow.
    chunks, _, _ = reader(slow)
    wait_for(lambda: conn.window(slow_id) > 0, "the slow stream's window given back")
    assert chunks


def test_data_left_unread_in_a_closed_stream_is_given_back_to_the_connection(
    pool: H2Pool, server: Server
) -> None:
    stream, conn, sid = open_stream(pool, server, 0)
    before = conn.window()
    conn.send(sid, b"y" * 500_000)
    wait_for(lambda: stream._chunks, "data at the client")
    stream.close()
    wait_for(lambda: sid in conn.resets, "the reset")
    other, _, other_id = open_stream(pool, server, 1)
    # h2 returns window once half of it is used: nothing of the 500 kB may stay lost.
    wait_for(lambda: conn.window() >= before - h2watch.CONNECTION_WINDOW // 2, "window")
    conn.send(other_id, b"z\n", end=True)
    assert b"".join(other.stream()) == b"z\n"


def test_request_headers_carry_the_path_authority_and_credentials_not_hop_by_hop_ones(
    pool: H2Pool, server: Server
) -> None:
    t = threading.Thread(
        target=lambda: pool.open("/api/v1/pods?watch=true", [("Authorization", "Bearer t"),
                                 ("Connection", "keep-alive"), ("Host", "x")], CAP),
        daemon=True,
    )  # fmt: skip
    t.start()
    conn, sid, path, headers = server.request(0)
    conn.respond(sid)
    t.join(CAP)
    assert path == "/api/v1/pods?watch=true"
    assert headers[b":authority"] == f"localhost:{server.port}".encode()
    assert headers[b"authorization"] == b"Bearer t"
    assert b"connection" not in headers and b"host" not in headers


def test_goaway_fails_the_connections_streams_as_transport_errors_and_the_next_goes_elsewhere(
    pool: H2Pool, server: Server
) -> None:
    old, conn, sid = open_stream(pool, server, 0)
    conn.goaway(last_stream_id=sid)
    with pytest.raises(H2TransportError, match="GOAWAY"):
        list(old.stream())
    new, conn2, sid2 = open_stream(pool, server, 1)
    assert conn2 is not conn and pool.connections_opened == 2
    conn2.send(sid2, b"new\n", end=True)
    assert b"".join(new.stream()) == b"new\n"


def test_a_stream_reset_by_the_server_fails_as_an_answer_not_a_network_error(
    pool: H2Pool, server: Server
) -> None:
    stream, conn, sid = open_stream(pool, server, 0)
    with conn.lock:
        conn.h2.reset_stream(sid, 2)
    with pytest.raises(StreamResetError):
        list(stream.stream())
    assert not kubeapi._is_transport_error(StreamResetError())
    assert pool.connections()[0].usable()  # one stream reset, the connection goes on


def test_a_connection_over_its_stream_limit_is_joined_by_another(
    tls_files: tuple[Path, Path],
) -> None:
    srv = Server(tls_files, max_streams=3)
    endpoint = h2watch.endpoint_from(configuration(srv.port, tls_files[0]))
    assert endpoint is not None
    p = H2Pool(endpoint, connect_timeout=CAP)
    try:
        streams = [open_stream(p, srv, i) for i in range(7)]
        assert p.connections_opened == 3
        assert [len(c.requests) for c in srv.conns] == [3, 3, 1]
        streams[0][0].close()
        open_stream(p, srv, 7)  # room again on the first connection
        assert p.connections_opened == 3
    finally:
        p.close()
        srv.close()


def test_a_silent_connection_is_pinged_then_closed_and_its_streams_fail_as_transport_errors(
    pool: H2Pool, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h2watch, "READ_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(h2watch, "PING_TIMEOUT_SECONDS", 0.2)
    stream, conn, _ = open_stream(pool, server, 0)
    conn.muted = True  # the path is gone: nothing is answered, PINGs neither
    with pytest.raises(H2TransportError) as err:
        list(stream.stream())
    assert "PING" in str(err.value)
    assert isinstance(err.value, OSError)  # what the reporter's retry rules call no answer
    assert kubeapi._is_transport_error(err.value)


def test_an_idle_connection_that_answers_pings_stays(
    pool: H2Pool, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h2watch, "READ_IDLE_SECONDS", 0.05)
    monkeypatch.setattr(h2watch, "PING_TIMEOUT_SECONDS", 5.0)
    stream, conn, sid = open_stream(pool, server, 0)
    c = pool.connections()[0]
    seen = c.last_data
    wait_for(lambda: c.last_data > seen + 0.3, "PING answers")  # several PINGs answered
    assert c.usable()
    conn.send(sid, b"late\n", end=True)
    assert b"".join(stream.stream()) == b"late\n"


def test_the_server_closing_the_connection_fails_its_streams(pool: H2Pool, server: Server) -> None:
    stream, conn, _ = open_stream(pool, server, 0)
    conn.kill()
    with pytest.raises(H2TransportError):
        list(stream.stream())


def test_no_response_headers_in_time_is_a_timeout_and_resets_the_stream(
    pool: H2Pool, server: Server
) -> None:
    with pytest.raises(TimeoutError):
        pool.open("/slow", [], 0.3)
    conn, sid, _, _ = server.request(0)
    wait_for(lambda: sid in conn.resets, "the reset of the timed-out stream")


def test_a_server_that_does_not_choose_h2_is_refused_as_not_http2(
    tls_files: tuple[Path, Path],
) -> None:
    srv = Server(tls_files, alpn=("http/1.1",))
    endpoint = h2watch.endpoint_from(configuration(srv.port, tls_files[0]))
    assert endpoint is not None
    try:
        with pytest.raises(NotHttp2):
            H2Pool(endpoint, connect_timeout=CAP).open("/", [], CAP)
    finally:
        srv.close()


def test_a_wrong_ca_fails_the_handshake(
    server: Server, tmp_path: Path, tls_files: tuple[Path, Path]
) -> None:
    ca = tmp_path / "other.pem"
    ca.write_bytes(self_signed("other")[0])
    endpoint = h2watch.endpoint_from(configuration(server.port, ca))
    assert endpoint is not None
    with pytest.raises(ssl.SSLCertVerificationError):
        H2Pool(endpoint, connect_timeout=CAP).open("/", [], CAP)


def test_endpoint_follows_the_clients_tls_settings(tls_files: tuple[Path, Path]) -> None:
    plain = client.Configuration()
    plain.host = "http://127.0.0.1:8080"
    assert h2watch.endpoint_from(plain) is None
    proxied = configuration(1, tls_files[0], proxy="http://proxy:3128")
    assert h2watch.endpoint_from(proxied) is None
    insecure = h2watch.endpoint_from(configuration(6443, tls_files[0], verify_ssl=False))
    assert insecure is not None and insecure.ssl_context.verify_mode == ssl.CERT_NONE
    named = h2watch.endpoint_from(configuration(6443, tls_files[0], tls_server_name="api.internal"))
    assert named is not None and named.server_hostname == "api.internal"
    assert named.authority == "localhost:6443" and named.port == 6443
    unchecked = h2watch.endpoint_from(configuration(6443, tls_files[0], assert_hostname=False))
    assert unchecked is not None and unchecked.ssl_context.check_hostname is False
    assert named.ssl_context.verify_mode == ssl.CERT_REQUIRED and named.ssl_context.check_hostname


# --- RawApi over HTTP/2 -----------------------------------------------------------------


def raw_api(server: Server, tls_files: tuple[Path, Path]) -> kubeapi.RawApi:
    api_client = client.ApiClient(configuration(server.port, tls_files[0]))
    return kubeapi.RawApi(
        api_client, request_timeout=CAP, watch_pool=kubeapi.http2_watch_pool(api_client)
    )


POD = kubeapi.Resource("Pod", "v1", "pods", True)


def test_raw_api_watch_streams_events_over_http2_with_the_clients_credentials(
    server: Server, tls_files: tuple[Path, Path]
) -> None:
    api = raw_api(server, tls_files)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(api.watch(POD, "42", "ns", "a=b")), daemon=True)
    t.start()
    conn, sid, path, headers = server.request(0)
    assert path.startswith("/api/v1/namespaces/ns/pods?")
    assert "resourceVersion=42" in path and "watch=true" in path and "labelSelector=a%3Db" in path
    assert headers[b"authorization"] == b"Bearer sekret-token"
    conn.respond(sid)
    t.join(CAP)
    conn.send(
        sid,
        b'{"type": "ADDED", "object": {"metadata": {"name": "p"}}}\n{"type": "BOOK',
    )
    conn.send(sid, b'MARK", "object": {}}\n', end=True)
    assert [e["type"] for e in out[0]] == ["ADDED", "BOOKMARK"]
    assert api.watch_pool is not None and api.watch_pool.connections_opened == 1


def test_raw_api_watch_error_answer_is_an_api_exception_with_body_and_headers(
    server: Server, tls_files: tuple[Path, Path]
) -> None:
    api = raw_api(server, tls_files)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            api.watch(POD, "1", "ns")
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    conn, sid, _, _ = server.request(0)
    conn.respond(sid, 410, ((b"retry-after", b"3"),))
    conn.send(sid, b'{"kind": "Status", "code": 410}', end=True)
    t.join(CAP)
    (exc,) = errors
    assert isinstance(exc, ApiException)
    assert exc.status == 410 and exc.reason == "Gone"
    assert '"code": 410' in exc.body
    assert dict(exc.headers) == {"retry-after": "3"}


def test_raw_api_falls_back_to_http1_when_the_server_refuses_http2(
    tls_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = Server(tls_files, alpn=("http/1.1",))
    try:
        api = raw_api(srv, tls_files)
        calls: list[str] = []
        fake = SimpleNamespace(response=SimpleNamespace(connection=None))
        monkeypatch.setattr(api, "request", lambda method, path, **kw: calls.append(path) or fake)
        assert isinstance(api.watch(POD, "1", "ns"), kubeapi._HttpWatchStream)
        assert calls == ["/api/v1/namespaces/ns/pods"]
        assert api.watch_pool is not None and api.watch_pool.refused
        assert api.with_timeout(1.0).watch_pool is api.watch_pool  # shared: all fall back
    finally:
        srv.close()


def test_recovery_closes_only_the_http2_connections_silent_since_the_failure(
    pool: H2Pool, server: Server
) -> None:
    open_stream(pool, server, 0)
    conn = pool.connections()[0]
    assert pool.close_silent(conn.last_data - 1.0) == 0
    assert conn.usable()
    assert pool.close_silent(time.monotonic() + 1.0) == 1
    assert not conn.usable()
