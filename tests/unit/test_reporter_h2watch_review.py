"""Review of reporter.h2watch and the HTTP/2 watch path of reporter.kubeapi: each test is a
scenario a review found broken (or an existing test could not catch), against the same real
TLS HTTP/2 server on loopback as ``test_reporter_h2watch``.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_reporter_h2watch import (
    CAP,
    POD,
    Server,
    configuration,
    open_stream,
    raw_api,
    reader,
    self_signed,
    wait_for,
)
from test_reporter_h2watch import pool as pool
from test_reporter_h2watch import server as server
from test_reporter_h2watch import tls_files as tls_files

from reporter import h2watch, kubeapi, retry
from reporter.h2watch import H2Pool, H2TransportError


def _in_thread(fn: Any) -> tuple[list[Any], list[BaseException], threading.Thread]:
    """Run ``fn`` in a daemon thread: what it returned, what it raised."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return out, errors, t


# --- a watch stream that stops sending on a live connection -----------------------------


def test_a_watch_silent_past_its_timeout_on_a_live_connection_fails_and_is_reset(
    server: Server, tls_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An HTTP/2-terminating load balancer whose backend died keeps answering PINGs; the
    stream then never ends. Over HTTP/1.1 the socket's read timeout (``timeoutSeconds`` +
    slack) ends such a watch; over HTTP/2 the read waited forever: a stale cache for good."""
    monkeypatch.setattr(kubeapi, "WATCH_READ_SLACK", 0.3)
    api = raw_api(server, tls_files)
    out, errors, t = _in_thread(lambda: api.watch(POD, "1", "ns", timeout_seconds=0))
    conn, sid, _, _ = server.request(0)
    conn.respond(sid)
    t.join(CAP)
    (stream,) = out
    _, errors, t = _in_thread(lambda: list(stream))
    t.join(CAP)
    assert not t.is_alive(), "the watch read stayed blocked on a silent stream"
    (exc,) = errors
    assert isinstance(exc, TimeoutError) and retry.is_transient(exc)
    wait_for(lambda: sid in conn.resets, "RST_STREAM of the timed-out watch")
    assert api.watch_pool is not None and api.watch_pool.connections()[0].usable()


def test_the_read_timeout_counts_from_the_last_data_not_from_the_start(
    pool: H2Pool,
    server: Server,
) -> None:
    """Like a socket timeout: a stream that keeps delivering is never cut."""
    stream, conn, sid = open_stream(pool, server, 0)
    stream.read_timeout = 0.5
    chunks, errors, t = reader(stream)
    for i in range(6):
        conn.send(sid, f"{i}\n".encode())
        time.sleep(0.2)
    conn.end(sid)
    t.join(CAP)
    assert errors == [] and b"".join(chunks) == b"0\n1\n2\n3\n4\n5\n"


# --- Retry-After of an error answer ------------------------------------------------------


def test_retry_after_of_an_http2_error_answer_is_honoured(
    server: Server,
    tls_files: tuple[Path, Path],
) -> None:
    """HTTP/2 header names are lower case; ``retry.retry_after`` asks for "Retry-After", as
    urllib3's case-insensitive headers answer it over HTTP/1.1. A 429 on a watch was
    retried after the backoff's delay instead of the server's."""
    api = raw_api(server, tls_files)
    _, errors, t = _in_thread(lambda: api.watch(POD, "1", "ns"))
    conn, sid, _, _ = server.request(0)
    conn.respond(sid, 429, ((b"retry-after", b"7"),))
    conn.send(sid, b'{"kind": "Status", "code": 429}', end=True)
    t.join(CAP)
    (exc,) = errors
    assert isinstance(exc, ApiException) and exc.status == 429
    assert retry.retry_after(exc) == 7.0
    assert exc.headers["Retry-After"] == "7" and exc.headers["retry-after"] == "7"


# --- TLS files re-read per connection, as urllib3 does ----------------------------------


def test_a_rotated_ca_file_is_used_by_the_next_http2_connection(
    tls_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """urllib3 loads the CA (and client certificate) files for each new connection, so the
    HTTP/1.1 requests follow a rotated certificate; the HTTP/2 context was built once at
    start-up, and every watch failed its handshake until the reporter was restarted."""
    cert1, key1 = self_signed("localhost")
    cert2, key2 = self_signed("localhost")
    files = {}
    for n, (cert, key) in enumerate(((cert1, key1), (cert2, key2))):
        files[n] = (tmp_path / f"c{n}.pem", tmp_path / f"k{n}.pem")
        files[n][0].write_bytes(cert)
        files[n][1].write_bytes(key)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(cert1)
    srv = Server(files[0])
    endpoint = h2watch.endpoint_from(configuration(srv.port, ca))
    assert endpoint is not None
    p = H2Pool(endpoint, connect_timeout=CAP)
    try:
        open_stream(p, srv, 0)
        # The server's certificate is rotated, and the CA file with it.
        srv.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        srv.ctx.load_cert_chain(*map(str, files[1]))
        srv.ctx.set_alpn_protocols(["h2"])
        ca.write_bytes(cert2)
        for c in p.connections():
            c.close()
        stream, conn, sid = open_stream(p, srv, 1)
        conn.send(sid, b"ok\n", end=True)
        assert b"".join(stream.stream()) == b"ok\n"
    finally:
        p.close()
        srv.close()


# --- proxies: NO_PROXY as the HTTP/1.1 client reads it ----------------------------------


def test_a_proxy_the_api_server_bypasses_does_not_turn_http2_off(
    tls_files: tuple[Path, Path],
) -> None:
    """The client takes HTTPS_PROXY/NO_PROXY from the environment; a pod with a proxy for
    the outside and NO_PROXY naming the API server talks to it directly over HTTP/1.1, yet
    its watches were refused HTTP/2 and each held a TLS connection again."""
    bypassed = configuration(6443, tls_files[0], proxy="http://proxy:3128", no_proxy="localhost")
    assert h2watch.endpoint_from(bypassed) is not None
    proxied = configuration(6443, tls_files[0], proxy="http://proxy:3128", no_proxy="other")
    assert h2watch.endpoint_from(proxied) is None


# --- a connection that fails before its SETTINGS ----------------------------------------


class _ClosingServer:
    """A TLS server that offers h2 and closes each connection right after the handshake
    (as a server rejecting a TLS 1.3 client certificate does, after the client finished)."""

    def __init__(self, tls: tuple[Path, Path]) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(*map(str, tls))
        self.ctx.set_alpn_protocols(["h2"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
                self.ctx.wrap_socket(raw, server_side=True).close()
            except OSError:
                if self.listener.fileno() < 0:
                    return


def test_a_connection_closed_before_its_settings_fails_at_once_not_after_the_timeout(
    tls_files: tuple[Path, Path],
) -> None:
    """The I/O thread saw the connection fail, but the opener waited for SETTINGS until its
    connect timeout, holding the pool's lock: every watch of the process waited behind it."""
    srv = _ClosingServer(tls_files)
    endpoint = h2watch.endpoint_from(configuration(srv.port, tls_files[0]))
    assert endpoint is not None
    p = H2Pool(endpoint, connect_timeout=CAP)
    started = time.monotonic()
    try:
        with pytest.raises(OSError):
            p.open("/w", [], CAP)
        assert time.monotonic() - started < CAP / 4
    finally:
        p.close()
        srv.listener.close()


# --- stream IDs used up ---------------------------------------------------------------


def test_a_connection_out_of_stream_ids_takes_no_more_streams(
    pool: H2Pool,
    server: Server,
) -> None:
    """A client may open 2**30 streams on a connection; then h2 refuses new ones. The
    connection still had "room" and every watch sent to it failed, for good."""
    open_stream(pool, server, 0)
    (c,) = pool.connections()
    with c.lock:
        c.h2.highest_outbound_stream_id = c.h2.HIGHEST_ALLOWED_STREAM_ID
    stream, conn, sid = open_stream(pool, server, 1)
    assert pool.connections_opened == 2 and conn is not server.conns[0]
    conn.send(sid, b"fresh\n", end=True)
    assert b"".join(stream.stream()) == b"fresh\n"


# --- the protocol state closed before the connection is marked dead ----------------------


def test_closing_a_stream_while_the_io_thread_fails_its_connection_raises_nothing(
    pool: H2Pool,
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GOAWAY h2's state is CLOSED at once, but the connection was marked dead only
    once the I/O thread had let go of the lock and taken it again in ``close``. A consumer
    closing its stream in between got h2's ProtocolError (not an OSError): from the error
    path of ``_watch_http2`` it replaced the server's ApiException."""
    stream, conn, _ = open_stream(pool, server, 0)
    (c,) = pool.connections()
    entered, proceed = threading.Event(), threading.Event()
    real_close = h2watch._Connection.close

    def slow_close(self: h2watch._Connection, why: BaseException | None = None) -> None:
        if threading.current_thread() is self._thread:
            entered.set()
            proceed.wait(CAP)
        real_close(self, why)

    monkeypatch.setattr(h2watch._Connection, "close", slow_close)
    conn.goaway(last_stream_id=1)
    assert entered.wait(CAP), "the I/O thread did not fail the connection"
    try:
        stream.close()  # in the window between h2's CLOSED and ``dead``
    finally:
        proceed.set()
    wait_for(lambda: not c._thread.is_alive(), "the I/O thread to end")


# --- shutdown ---------------------------------------------------------------------------


def test_a_closed_pool_opens_no_new_connection(pool: H2Pool, server: Server) -> None:
    """After shutdown closed the pool, an informer still on its way out opened a new
    connection (a socket and an I/O thread nobody would close)."""
    open_stream(pool, server, 0)
    pool.close()
    with pytest.raises(H2TransportError):
        pool.open("/w", [], CAP)
    assert pool.connections_opened == 1 and len(server.conns) == 1


# --- a stronger form of an existing test ------------------------------------------------


def test_unread_data_of_a_closed_stream_goes_back_to_the_connection_window(
    tls_files: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``test_data_left_unread_in_a_closed_stream_is_given_back_to_the_connection`` passes
    with that window never given back (it allows half a GiB of slack). With a 1 MiB
    connection window the loss shows: the next stream could not get its data through."""
    monkeypatch.setattr(h2watch, "CONNECTION_WINDOW", h2watch.STREAM_WINDOW)
    srv = Server(tls_files)
    endpoint = h2watch.endpoint_from(configuration(srv.port, tls_files[0]))
    assert endpoint is not None
    p = H2Pool(endpoint, connect_timeout=CAP)
    try:
        stream, conn, sid = open_stream(p, srv, 0)
        size = 600_000  # over half the connection's window: h2 then sends WINDOW_UPDATE
        assert conn.send(sid, b"y" * size) == size
        wait_for(lambda: sum(len(d) for d, _ in stream._chunks) == size, "data at the client")
        stream.close()
        wait_for(lambda: sid in conn.resets, "the reset")
        other, _, other_id = open_stream(p, srv, 1)
        wait_for(lambda: conn.window() >= size, "the connection's window given back")
        assert conn.send(other_id, b"z" * size, end=True) == size
        assert len(b"".join(other.stream())) == size
    finally:
        p.close()
        srv.close()


# --- certificate checks the HTTP/1.1 path makes too -------------------------------------


def test_a_certificate_for_another_name_fails_the_handshake(
    server: Server,
    tls_files: tuple[Path, Path],
) -> None:
    """The server's certificate names localhost; reached as 127.0.0.1 it must be refused
    (no test checked that the HTTP/2 path checks the host name at all)."""
    conf = configuration(server.port, tls_files[0])
    conf.host = f"https://127.0.0.1:{server.port}"
    endpoint = h2watch.endpoint_from(conf)
    assert endpoint is not None
    with pytest.raises(ssl.SSLCertVerificationError):
        H2Pool(endpoint, connect_timeout=CAP).open("/", [], CAP)


def test_tls_server_name_is_sent_and_checked(
    server: Server,
    tls_files: tuple[Path, Path],
) -> None:
    """``tls_server_name`` (kubeconfig ``tls-server-name``): SNI and the name checked, as
    the HTTP/1.1 pool's ``server_hostname``."""
    conf = configuration(server.port, tls_files[0], tls_server_name="localhost")
    conf.host = f"https://127.0.0.1:{server.port}"
    endpoint = h2watch.endpoint_from(conf)
    assert endpoint is not None
    p = H2Pool(endpoint, connect_timeout=CAP)
    try:
        stream, conn, sid = open_stream(p, server, 0)
        conn.send(sid, b"ok\n", end=True)
        assert b"".join(stream.stream()) == b"ok\n"
    finally:
        p.close()


# --- recovery: silent watches restart quietly -------------------------------------------


def test_a_silent_http2_watch_restarted_at_recovery_ends_quietly(
    server: Server, tls_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the API server was unreachable, the first answer restarts the watches silent
    since: each is closed, which ends its read quietly. The silent HTTP/2 connections were
    closed first, so a watch's reader could wake to the connection's failure before its
    stream was marked closed: a "list/watch failed" warning and a backoff instead."""
    api = raw_api(server, tls_files)
    out, _, t = _in_thread(lambda: api.watch(POD, "1", "ns"))
    conn, sid, _, _ = server.request(0)
    conn.respond(sid)
    t.join(CAP)
    (watch,) = out
    _, errors, reading = _in_thread(lambda: list(watch))
    real_close = h2watch._Connection.close

    def close_and_let_the_reader_run(
        self: h2watch._Connection, why: BaseException | None = None
    ) -> None:
        real_close(self, why)
        reading.join(2.0)  # the reader wakes first, as it may in production

    monkeypatch.setattr(h2watch._Connection, "close", close_and_let_the_reader_run)
    api.connectivity.failed()
    time.sleep(0.01)
    api.connectivity.answered(time.monotonic())
    reading.join(CAP)
    assert not reading.is_alive() and errors == []


# --- a slow connect holds nobody else up --------------------------------------------------


def test_close_silent_does_not_wait_for_a_connection_being_opened(
    tls_files: tuple[Path, Path],
) -> None:
    """The request that proves the API server back (often the Lease loop's) calls
    ``close_silent``; it waited for the pool's lock, which an opener holds for a whole
    connect to a server that does not answer the handshake (here: up to ``CAP`` s)."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts TCP, never speaks TLS
    endpoint = h2watch.endpoint_from(configuration(silent.getsockname()[1], tls_files[0]))
    assert endpoint is not None
    stuck = H2Pool(endpoint, connect_timeout=CAP)
    try:
        _, _, opener = _in_thread(lambda: stuck.open("/w", [], CAP))
        wait_for(lambda: stuck._lock.locked(), "the opener to connect")
        time.sleep(0.2)
        started = time.monotonic()
        assert stuck.close_silent(time.monotonic()) == 0
        assert time.monotonic() - started < 1.0
        assert opener.is_alive()  # still connecting
    finally:
        silent.close()
        stuck.close()
