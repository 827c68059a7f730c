"""Watch streams multiplexed over HTTP/2: many watches share one TLS connection, as in client-go.

Why: over HTTP/1.1 every open watch holds a TLS connection of its own. At 100 driver
namespaces the stack reporter opens 804 watches; a watch on its own connection, with the
thread reading it, measured about 165 KiB, and the reporter used 214 MiB (BENCHMARKS.md
section 6). client-go sends its watches over HTTP/2, as many per connection as the server
allows; this module does the same with ``h2``, python-hyper's HTTP/2 protocol state machine
(the HTTP/2 clients of the Python ecosystem either do not multiplex or do not reset a stream
they stop reading, which lets the server go on sending into a shrinking window).

Shape:
- ``H2Pool`` opens a stream on a connection that has room (at most the server's
  MAX_CONCURRENT_STREAMS and ``MAX_STREAMS_PER_CONNECTION``) or on a new connection. A
  GOAWAY from the server (it is shutting down) ends the connection and fails its streams like
  a broken connection: h2 cannot go on with the streams the server would still finish.
- Each ``_Connection`` does all of its socket I/O in one thread (an OpenSSL connection must not
  be read and written by two threads at once); the threads that consume streams change the
  protocol state under the connection's lock and wake the I/O thread through a socket pair.
- A stream's flow-control window is given back as its consumer reads, so a consumer that falls
  behind holds at most ``STREAM_WINDOW`` bytes, while the connection's window is large, so one
  slow stream cannot stall the others.
- Closing a stream before its end sends RST_STREAM (the server stops sending it) and wakes
  its consumer at once.
- A connection that received nothing for ``READ_IDLE_SECONDS`` is sent a PING, and closed when
  nothing arrives within ``PING_TIMEOUT_SECONDS`` after it (client-go's HTTP/2 health check,
  with its defaults): its streams fail with a transport error (an ``OSError``), and their
  informers resume over another connection.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from kubernetes.client.rest import should_bypass_proxies

log = logging.getLogger(__name__)

# The server's limit applies too (kube-apiserver: --http2-max-streams-per-connection, 1000 by
# default); a lower limit of our own spreads the watches over a few connections, so that one
# connection lost is not every watch lost at once.
MAX_STREAMS_PER_CONNECTION = 250
# Per stream: what the server may send before the consumer read it. A watch event is a few
# KiB (trimmed objects are cached, whole ones travel); a re-list after a burst is a list, not
# a watch.
STREAM_WINDOW = 1 << 20
# Per connection: large, so that streams whose consumers lag cannot stall the others.
CONNECTION_WINDOW = 1 << 30
READ_IDLE_SECONDS = 30.0
PING_TIMEOUT_SECONDS = 15.0
READ_SIZE = 65536
_DEFAULT_WINDOW = 65535
# Request headers that HTTP/2 forbids (RFC 9113 section 8.2.2) or carries as pseudo-headers.
_NOT_IN_HTTP2 = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                 b"upgrade", b"host", b"te"}  # fmt: skip


class H2TransportError(ConnectionError):
    """The HTTP/2 connection under a stream failed or was closed: a transport error, like a
    reset TCP connection (``ConnectionError`` is an ``OSError``, which the reporter's retry
    rules treat as "no answer")."""


class StreamResetError(Exception):
    """The server reset the stream (RST_STREAM): an answer, not a network failure; the
    informer re-watches after its backoff."""


class NotHttp2(Exception):
    """The server did not agree to HTTP/2 (ALPN): watches go over HTTP/1.1 instead."""


@dataclass(frozen=True)
class TlsFiles:
    """The client's TLS settings, read from their files for each new connection."""

    verify: bool = True
    ca_file: str | None = None
    ca_data: str | bytes | None = None
    check_hostname: bool = True
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        """A new context from the files as they are now: urllib3 loads the CA and the client
        certificate for every connection it opens, so the HTTP/1.1 requests follow a rotated
        certificate; a context built once at start-up would fail every HTTP/2 handshake
        after the rotation, until a restart."""
        if self.verify and (self.ca_file or self.ca_data):
            ctx = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cafile=self.ca_file, cadata=self.ca_data
            )
        else:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif not self.check_hostname:
            ctx.check_hostname = False
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.set_alpn_protocols(["h2"])
        return ctx


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: the API server's address and the client's TLS settings."""

    host: str
    port: int
    authority: str
    server_hostname: str | None
    tls: TlsFiles
    socket_options: tuple[tuple[int, int, int], ...] = ()

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """A context for a new connection, its files read now (``TlsFiles.context``)."""
        return self.tls.context()


def endpoint_from(configuration: Any) -> Endpoint | None:
    """The HTTP/2 endpoint of a ``kubernetes.client.Configuration``, with the same TLS
    settings the client's HTTP/1.1 pool uses (CA, client certificate, verification, server
    name); None where HTTP/2 is not used: plain ``http://`` (no ALPN) or through a proxy."""
    url = urlsplit(str(configuration.host))
    if url.scheme != "https" or not url.hostname:
        return None
    proxy = getattr(configuration, "proxy", None)
    # The client's own rule (it also reads HTTPS_PROXY/NO_PROXY from the environment): a
    # pod with a proxy for the outside and NO_PROXY naming the API server reaches it
    # directly over HTTP/1.1, and so do its watches over HTTP/2.
    if proxy and not should_bypass_proxies(
        str(configuration.host), getattr(configuration, "no_proxy", None) or ""
    ):
        return None
    tls = TlsFiles(
        verify=bool(configuration.verify_ssl),
        ca_file=configuration.ssl_ca_cert or None,
        ca_data=getattr(configuration, "ca_cert_data", None) or None,
        check_hostname=configuration.assert_hostname is not False,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
    )
    tls.context()  # a wrong setting fails at start-up, as it did
    port = url.port or 443
    server_hostname = getattr(configuration, "tls_server_name", None) or url.hostname
    return Endpoint(
        host=url.hostname,
        port=port,
        authority=url.netloc.rsplit("@", 1)[-1],
        server_hostname=server_hostname,
        tls=tls,
        socket_options=tuple(getattr(configuration, "socket_options", None) or ()),
    )


class H2Stream:
    """One request's response: its status, headers and body chunks, as they arrive.

    The I/O thread feeds it (``_on_*``, under the connection's lock); one consumer reads it.
    """

    def __init__(self, conn: _Connection, stream_id: int) -> None:
        self._conn = conn
        self.stream_id = stream_id
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[tuple[bytes, int]] = collections.deque()
        self._ended = False
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition(conn.lock)
        # Seconds ``stream`` waits for the next data before it resets the stream and raises
        # ``TimeoutError``, as a socket's read timeout ends an HTTP/1.1 watch: the PINGs
        # prove the connection, not the stream (an HTTP/2-terminating load balancer whose
        # backend died answers them, and the stream never ends). None: no limit.
        self.read_timeout: float | None = None

    # Fed by the I/O thread, under conn.lock.
    def _on_headers(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        for key, value in headers:
            if key == b":status":
                self.status = int(value)
            elif not key.startswith(b":"):
                self.headers.append((key, value))
        self._cond.notify_all()

    def _on_data(self, data: bytes, flow_length: int) -> None:
        self._chunks.append((data, flow_length))
        self._cond.notify_all()

    def _on_end(self) -> None:
        self._ended = True
        self._cond.notify_all()

    def _on_error(self, exc: BaseException) -> None:
        if self._error is None and not self._ended:
            self._error = exc
        self._cond.notify_all()

    # Read by the consumer.
    def wait_headers(self, timeout: float) -> None:
        """Until the response's status arrived; ``TimeoutError`` (an ``OSError``) after
        ``timeout`` seconds, the stream then reset."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.status is None:
                self._raise_if_failed()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self.status is not None:
                return
        self.close()
        raise TimeoutError(f"no response headers within {timeout:g} s (HTTP/2 stream)")

    def _raise_if_failed(self) -> None:
        if self._closed:
            raise H2TransportError("stream closed")
        if self._error is not None:
            raise self._error

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        """The body's chunks until the server ends the stream (urllib3's ``stream`` shape).

        Raises what ended it otherwise: the connection failing (``H2TransportError``), the
        server's reset (``StreamResetError``), nothing for ``read_timeout`` seconds
        (``TimeoutError``, the stream then reset); ends quietly once ``close`` was called.
        """
        while True:
            with self._cond:
                data = self._next_chunk()
            if data is None:
                return
            if data:
                yield data

    def _next_chunk(self) -> bytes | None:
        """The next chunk (its window given back), None at the end (caller holds the lock)."""
        limit = self.read_timeout
        deadline = None if limit is None else time.monotonic() + limit
        while not self._chunks and not self._ended:
            if self._closed:
                return None
            if self._error is not None:
                raise self._error
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                # Reset at once (close under the lock it holds: the lock is not re-entrant,
                # so the consumer must not come back for it) and raise as a socket would.
                self._close_locked()
                raise TimeoutError(f"no data for {limit:g} s (HTTP/2 stream {self.stream_id})")
            self._cond.wait(left)
        if not self._chunks:
            return None  # ended, all read
        data, flow_length = self._chunks.popleft()
        self._conn._acknowledge(self.stream_id, flow_length)
        return data

    def read(self, timeout: float) -> bytes:
        """The whole body (an error answer's), waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        parts: list[bytes] = []
        with self._cond:
            while not self._ended:
                self._raise_if_failed()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            while self._chunks:
                data, flow_length = self._chunks.popleft()
                self._conn._acknowledge(self.stream_id, flow_length)
                parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        """Stop the stream: RST_STREAM to the server unless it ended, and wake the consumer."""
        with self._cond:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        unread = sum(n for _, n in self._chunks)
        self._chunks.clear()
        self._conn._forget(self, reset=not self._ended, unread=unread)
        self._cond.notify_all()

    # urllib3-response compatibility for ``reporter.kubeapi``.
    def release_conn(self) -> None:
        """Nothing to release: the connection is shared and stays with the pool."""


class _Connection:
    """One TLS connection speaking HTTP/2, and the thread that does its I/O."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float) -> None:
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.streams: dict[int, H2Stream] = {}
        self.dead: BaseException | None = None
        self.last_data = time.monotonic()
        self._ping_sent: float | None = None
        self._settled = threading.Event()
        raw = socket.create_connection((endpoint.host, endpoint.port), timeout=connect_timeout)
        try:
            for opt in endpoint.socket_options:
                raw.setsockopt(*opt)
            self.sock = endpoint.ssl_context.wrap_socket(
                raw, server_hostname=endpoint.server_hostname
            )
        except BaseException:
            raw.close()
            raise
        if self.sock.selected_alpn_protocol() != "h2":
            self.sock.close()
            raise NotHttp2(f"{endpoint.authority} did not choose HTTP/2 (ALPN)")
        self.sock.setblocking(False)
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
            },
        )
        del self.h2.local_settings[h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL]
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONNECTION_WINDOW - _DEFAULT_WINDOW)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(
            target=self._run, name=f"h2-{endpoint.authority}", daemon=True
        )
        self._thread.start()
        if not self._settled.wait(connect_timeout) or self.dead is not None:
            reason = self.dead or "no SETTINGS from the server"
            self.close(H2TransportError(f"HTTP/2 connection to {endpoint.authority}: {reason}"))
            raise H2TransportError(f"HTTP/2 connection to {endpoint.authority}: {reason}")

    def usable(self) -> bool:
        """Still up: may take new streams when it has room."""
        return self.dead is None

    def has_room(self) -> bool:
        """Up, under both stream limits, and with a stream ID left: after 2**30 streams h2
        refuses to open more, and a connection that still took them failed every watch
        sent to it, for good (Go's transport stops reusing such a connection too)."""
        with self.lock:
            if not self.usable():
                return False
            highest = self.h2.highest_outbound_stream_id or -1
            if highest + 2 > self.h2.HIGHEST_ALLOWED_STREAM_ID:
                return False
            limit = min(self.h2.remote_settings.max_concurrent_streams, MAX_STREAMS_PER_CONNECTION)
            return self.h2.open_outbound_streams < limit

    def open(self, headers: list[tuple[bytes, bytes]]) -> H2Stream:
        with self.lock:
            if self.dead is not None:
                raise H2TransportError(f"HTTP/2 connection lost: {self.dead}")
            stream_id = self.h2.get_next_available_stream_id()
            self.h2.send_headers(stream_id, headers, end_stream=True)
            stream = H2Stream(self, stream_id)
            self.streams[stream_id] = stream
        self._wake()
        return stream

    def _acknowledge(self, stream_id: int, flow_length: int) -> None:
        """Give ``flow_length`` bytes of window back (caller holds the lock)."""
        if flow_length and self.dead is None:
            self.h2.acknowledge_received_data(flow_length, stream_id)
            self._wake()

    def _forget(self, stream: H2Stream, reset: bool, unread: int) -> None:
        """A consumer closed ``stream`` (caller holds the lock)."""
        self.streams.pop(stream.stream_id, None)
        if self.dead is not None:
            return
        if unread:
            self.h2.acknowledge_received_data(unread, stream.stream_id)
        if reset:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self.h2.reset_stream(stream.stream_id, h2.errors.ErrorCodes.CANCEL)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
            self._wake_w.send(b"x")

    def close(self, why: BaseException | None = None) -> None:
        """Close the connection: every stream on it fails with ``why``."""
        with self.lock:
            if self.dead is None:
                self.dead = why or H2TransportError("connection closed")
            for stream in list(self.streams.values()):
                stream._on_error(self.dead)
            self.streams.clear()
        # An opener waiting for the server's SETTINGS learns of the failure now, not at its
        # connect timeout (it holds the pool's lock: every watch's open waits behind it).
        self._settled.set()
        self._wake()

    # The I/O thread.
    def _run(self) -> None:
        out = bytearray()
        try:
            while True:
                with self.lock:
                    if self.dead is not None:
                        break
                    out += self.h2.data_to_send()
                timeout = self._liveness()
                readable, writable, _ = select.select(
                    [self.sock, self._wake_r], [self.sock] if out else [], [], timeout
                )
                if self._wake_r in readable:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                if self.sock in readable or self.sock.pending():
                    self._read()
                if out and self.sock in writable:
                    with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError,
                                             BlockingIOError):  # fmt: skip
                        del out[: self.sock.send(out)]
        except Exception as exc:
            self.close(_as_transport_error(exc))
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _liveness(self) -> float:
        """Seconds the next wait may last; sends the PING of an idle connection, and raises
        when its answer is overdue."""
        now = time.monotonic()
        if self._ping_sent is not None:
            if now - self._ping_sent >= PING_TIMEOUT_SECONDS:
                raise H2TransportError(f"no answer to a PING within {PING_TIMEOUT_SECONDS:g} s")
            return self._ping_sent + PING_TIMEOUT_SECONDS - now
        idle = now - self.last_data
        if idle >= READ_IDLE_SECONDS:
            with self.lock:
                self.h2.ping(os.urandom(8))
            self._ping_sent = now
            return 0.0
        return READ_IDLE_SECONDS - idle

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(READ_SIZE)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            if not data:
                raise H2TransportError("the server closed the connection")
            self.last_data = time.monotonic()
            self._ping_sent = None
            with self.lock:
                try:
                    for event in self.h2.receive_data(data):
                        self._dispatch(event)
                except Exception as exc:
                    # h2's state may be CLOSED now (a GOAWAY, a protocol error): marked dead
                    # before the lock is let go, so that no consumer drives h2 in between
                    # (its reset or acknowledgement would raise h2's ProtocolError).
                    if self.dead is None:
                        self.dead = _as_transport_error(exc)
                    raise

    def _dispatch(self, event: h2.events.Event) -> None:
        """Apply one protocol event (caller holds the lock)."""
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self._settled.set()
            return
        if isinstance(event, h2.events.ConnectionTerminated):
            # h2 ends the connection on GOAWAY (it would refuse the frames of the streams the
            # server still finishes), so every stream fails here as a broken connection does;
            # the informers re-watch from their resourceVersion over a new connection.
            raise H2TransportError(
                f"the API server is going away (GOAWAY, error {event.error_code})"
            )
        stream_id = getattr(event, "stream_id", None)
        stream = self.streams.get(stream_id) if stream_id else None
        if isinstance(event, h2.events.DataReceived) and stream is None:
            # Data of a stream nobody reads any more: give the window back at once.
            if event.flow_controlled_length and stream_id:
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
            return
        if stream is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            stream._on_headers(event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            stream._on_data(event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.StreamEnded):
            stream._on_end()
            del self.streams[stream_id]
        elif isinstance(event, h2.events.StreamReset):
            stream._on_error(StreamResetError(f"reset by the server (error {event.error_code})"))
            del self.streams[stream_id]


def _as_transport_error(exc: BaseException) -> H2TransportError:
    """What the streams of a failed connection raise: an ``OSError``, "no answer"."""
    return exc if isinstance(exc, H2TransportError) else H2TransportError(str(exc))


class H2Pool:
    """HTTP/2 connections to one API server, shared by every watch of the process."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        # Replaced, never changed in place: ``connections`` reads it without the lock, which
        # an opener holds for a whole connect (TCP, TLS and SETTINGS: up to three
        # ``connect_timeout``s). Behind it, ``close_silent`` held up the thread whose request
        # proved the API server back, often the Lease loop, by as long.
        self._conns: list[_Connection] = []
        self.connections_opened = 0
        # Set when the server refused HTTP/2: the watches go over HTTP/1.1 from then on.
        self.refused = False
        self._closed = False

    def open(
        self,
        path: str,
        headers: Sequence[tuple[str, str]],
        timeout: float,
        read_timeout: float | None = None,
    ) -> H2Stream:
        """Send ``GET path`` and wait up to ``timeout`` s for the response's headers; the
        body then fails when nothing arrives for ``read_timeout`` s (``H2Stream.read_timeout``).

        ``NotHttp2`` when the server does not speak HTTP/2; transport failures as ``OSError``.
        """
        request = [
            (b":method", b"GET"),
            (b":scheme", b"https"),
            (b":authority", self.endpoint.authority.encode()),
            (b":path", path.encode()),
        ]
        for key, value in headers:
            name = key.lower().encode()
            if name not in _NOT_IN_HTTP2:
                request.append((name, str(value).encode()))
        with self._lock:
            if self._closed:
                # Shut down: an informer on its way out must not open a connection (a socket
                # and an I/O thread) that nobody would close.
                raise H2TransportError("the HTTP/2 pool is closed")
            # Connections that failed or were told to go away leave the pool here (not from
            # their I/O thread: it holds its connection's lock, and this the pool's).
            self._conns = [c for c in self._conns if c.usable()]
            conn = next((c for c in self._conns if c.has_room()), None)
            if conn is None:
                conn = _Connection(self.endpoint, self.connect_timeout)
                self._conns = [*self._conns, conn]
                self.connections_opened += 1
            stream = conn.open(request)
        stream.read_timeout = read_timeout
        stream.wait_headers(timeout)
        return stream

    def connections(self) -> list[_Connection]:
        """The pool's connections now, without waiting for an opener (see ``_conns``)."""
        return list(self._conns)

    def close_silent(self, since: float) -> int:
        """Close the connections that received nothing since ``since`` (monotonic): after the
        API server was unreachable they may be dead without knowing it. Returns how many."""
        stale = [c for c in self.connections() if c.last_data < since]
        for conn in stale:
            conn.close(H2TransportError("silent since the API server was unreachable"))
        return len(stale)

    def close(self) -> None:
        """Close every connection; the pool opens no new ones."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
