"""Raw JSON access to the Kubernetes API: list, watch, get, create and patch by resource path.

The reporter works on plain camelCase dicts (see ``reporter.model``), for every kind alike.
The generated typed client would turn each object into a model class and back, per kind and per
event; going through ``ApiClient.param_serialize``/``call_api`` keeps the official client's
configuration, TLS and token handling (in-cluster token refresh included) while returning the
API server's JSON unchanged. ``RawApi`` is also the seam the unit tests replace with fakes.
"""

from __future__ import annotations

import contextlib
import http
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.keepalive import tcp_keepalive_socket_options

from reporter.h2watch import H2Pool, NotHttp2, endpoint_from

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# Applied to every listed or watched object before it is kept (see reporter.trim).
Transform = Callable[[Obj], Obj]

# Every non-watch request gives up after this long: a half-open connection must not block a
# status write or a Lease renewal forever (the Lease would be renewed by another thread while
# the writer hangs, so /healthz would stay green).
REQUEST_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
# Accept header of a metadata-only read (the API server's PartialObjectMetadata), with JSON
# as the fallback of a server that does not offer it.
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
# TCP keepalive on every connection: an idle watch on a dead connection is noticed after
# about IDLE + INTERVAL * COUNT = 30 s instead of at the end of the watch's read timeout.
# (Only when packets are lost: a peer whose TCP stack still answers, such as a proxy or load
# balancer whose backend is gone, keeps the connection "alive"; see ``Connectivity``.)
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 15, 5, 3
# A watch read gives up after the watch's timeoutSeconds plus this (HTTP/1.1: the socket's
# read timeout; HTTP/2: the stream's), so a stream the server forgot cannot hang for good.
WATCH_READ_SLACK = 15.0


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API: enough to build its collection and object paths."""

    kind: str
    api_version: str  # "v1" or "group/version"
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (name None) or of one object."""
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            prefix += f"/namespaces/{namespace}"
        prefix += f"/{self.plural}"
        return f"{prefix}/{name}" if name else prefix


class WatchStream(Protocol):
    """An open watch: iterate for decoded events, close to abort from another thread."""

    def __iter__(self) -> Iterator[Obj]: ...

    def close(self) -> None: ...


class Api(Protocol):
    """What the informers and writers need from the API server (fakes implement this)."""

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform | None = None,
    ) -> tuple[list[Obj], str]: ...

    def watch(
        self,
        res: Resource,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> WatchStream: ...

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None: ...

    def get_metadata(
        self, res: Resource, name: str, namespace: str | None = None
    ) -> Obj | None: ...


class _HttpWatchStream:
    """Newline-delimited JSON events from a streaming HTTP response."""

    def __init__(self, response: Any, connectivity: Connectivity | None = None) -> None:
        self._response = response
        self._connectivity = connectivity
        self._closed = False
        self.last_data = float("-inf")  # monotonic time the last bytes arrived
        if connectivity is not None:
            connectivity.opened(self)

    def __iter__(self) -> Iterator[Obj]:
        buffer = b""
        try:
            for chunk in self._response.stream(amt=None, decode_content=True):
                self.last_data = time.monotonic()
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
            if buffer.strip():
                yield json.loads(buffer)
        except Exception:
            if not self._closed:
                raise
            # Closed on purpose (stop, or a restart after the API server was unreachable):
            # the read that was cut short is the end of the stream, not an error.
        finally:
            self.close()

    def closing(self) -> None:
        """About to be closed on purpose: from now on the read ends quietly, whatever ends
        it (see ``Connectivity.answered``)."""
        self._closed = True

    def close(self) -> None:
        self._closed = True
        if self._connectivity is not None:
            self._connectivity.closed(self)
        # Another thread may be blocked reading this response. Closing the buffered file
        # waits for that read (it holds the buffer's lock) until data or the read timeout
        # arrives, which held up SIGTERM by up to the timeout; shutting the socket down
        # first makes the blocked read return at once.
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        try:
            self._response.close()
            self._response.release_conn()
        except Exception:  # closing a half-dead connection may fail; nothing to do about it
            log.debug("closing watch response failed", exc_info=True)


def _is_transport_error(exc: BaseException) -> bool:
    """No answer at all: refused, reset, timed out, TLS failed (the client's status 0)."""
    if isinstance(exc, ApiException):
        return not exc.status
    if isinstance(exc, urllib3.exceptions.ClosedPoolError):
        return False  # our own pool, closed by Connectivity a moment ago: not the network
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


class Connectivity:
    """Open watch streams, and whether the API server has just been unreachable.

    Why: a watch whose connection went silent (the path to the API server is gone, but some
    TCP stack in between still acknowledges) blocks in a read until its read timeout, up to
    ``timeoutSeconds + 15`` s, i.e. minutes of a stale cache after the network came back.
    Every other request times out after seconds, and the Lease loop sends one every second
    or two. So: once a request failed without an answer, the next request that gets any
    answer (sent after that failure) proves a working path, and every watch that has not
    received a byte since the failure is shut down; its informer resumes at once from its
    resourceVersion over a new connection. (A watch that did receive data since is alive and
    kept: an overloaded API server that timed out one request must not get every watch
    re-opened at once.) Idle pooled connections are dropped too, since they may be dead the
    same way. Shared by every ``RawApi`` made from one another (``with_timeout``).
    """

    def __init__(self, on_recovered: Callable[[float], None] = lambda since: None) -> None:
        self._lock = threading.Lock()
        self._streams: dict[_HttpWatchStream, float] = {}
        self._trouble_since: float | None = None
        self._on_recovered = on_recovered
        self.recoveries = 0

    def opened(self, stream: _HttpWatchStream) -> None:
        with self._lock:
            self._streams[stream] = time.monotonic()

    def closed(self, stream: _HttpWatchStream) -> None:
        with self._lock:
            self._streams.pop(stream, None)

    def failed(self) -> None:
        with self._lock:
            if self._trouble_since is None:
                self._trouble_since = time.monotonic()

    def answered(self, sent: float) -> None:
        with self._lock:
            since = self._trouble_since
            if since is None or sent < since:
                return
            self._trouble_since = None
            stale = [
                s
                for s, opened in self._streams.items()
                if max(opened, getattr(s, "last_data", opened)) < since
            ]
            self.recoveries += 1
        log.info("API server answers again; restarting %d silent watch(es)", len(stale))
        # Marked first: a watch's read then ends quietly whatever wakes it, its close or its
        # HTTP/2 connection closed under it (not a warning and a backoff). Then the silent
        # connections, then the watches: a watch closed before them is resumed at once by
        # its informer, over a silent connection still in the pool, which failed it again.
        for stream in stale:
            mark = getattr(stream, "closing", None)
            if mark is not None:
                mark()
        self._on_recovered(since)
        for stream in stale:
            stream.close()


class RawApi:
    """The real ``Api``, on top of one ``kubernetes.client.ApiClient``."""

    def __init__(
        self,
        api_client: client.ApiClient,
        request_timeout: float = REQUEST_TIMEOUT,
        connectivity: Connectivity | None = None,
        watch_pool: H2Pool | None = None,
    ) -> None:
        """``watch_pool``: HTTP/2 connections the watches share (``http2_watch_pool``);
        without one, or once the server refused HTTP/2, each watch has a connection of its
        own from the client's HTTP/1.1 pool."""
        self.api_client = api_client
        self.request_timeout = request_timeout
        self.watch_pool = watch_pool
        self.connectivity = connectivity or Connectivity(self._drop_idle_connections)

    def with_timeout(self, request_timeout: float) -> RawApi:
        """The same client (connections, credentials) with another per-request timeout."""
        return RawApi(self.api_client, request_timeout, self.connectivity, self.watch_pool)

    def _drop_idle_connections(self, since: float) -> None:
        pool_manager = getattr(getattr(self.api_client, "rest_client", None), "pool_manager", None)
        if pool_manager is not None:
            with contextlib.suppress(Exception):
                pool_manager.clear()
        if self.watch_pool is not None:
            closed = self.watch_pool.close_silent(since)
            if closed:
                log.info("closed %d silent HTTP/2 connection(s)", closed)

    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
        accept: str = "application/json",
    ) -> Any:
        """Send one request; return the raw streaming response, raise ApiException on non-2xx."""
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        req = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        if timeout is None:
            timeout = (min(CONNECT_TIMEOUT, self.request_timeout), self.request_timeout)
        sent = time.monotonic()
        try:
            resp = self.api_client.call_api(*req, _request_timeout=timeout)
        except Exception as exc:
            if _is_transport_error(exc):
                self.connectivity.failed()
            raise
        self.connectivity.answered(sent)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp

    def request_json(self, method: str, path: str, **kwargs: Any) -> Obj:
        resp = self.request(method, path, **kwargs)
        return json.loads(resp.read() or b"{}")

    @staticmethod
    def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, Any]]:
        query: list[tuple[str, Any]] = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        return query

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform | None = None,
    ) -> tuple[list[Obj], str]:
        """All matching objects and the list's resourceVersion, following ``continue``.

        ``transform`` trims each item as its page arrives, so a re-list of thousands of pods
        never holds more than one page of full objects at a time.
        """
        items: list[Obj] = []
        cont: str | None = None
        while True:
            query = self._selectors(label_selector, field_selector)
            query.append(("limit", 500))
            if cont:
                query.append(("continue", cont))
            data = self.request_json("GET", res.path(namespace), query=query)
            for item in data.get("items") or []:
                # List items carry neither kind nor apiVersion; add them so cached objects
                # look the same whether they came from a list or a watch event.
                item.setdefault("kind", res.kind)
                item.setdefault("apiVersion", res.api_version)
                items.append(transform(item) if transform else item)
            meta = data.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    def watch(
        self,
        res: Resource,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> WatchStream:
        query = self._selectors(label_selector, field_selector)
        query += [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", timeout_seconds),
        ]
        read_timeout = timeout_seconds + WATCH_READ_SLACK
        if self.watch_pool is not None and not self.watch_pool.refused:
            stream = self._watch_http2(res.path(namespace), query, read_timeout)
            if stream is not None:
                return stream
        # The response headers come at once (the events follow), so they get the ordinary
        # request timeout: a watch sent over a dead connection fails like any request.
        resp = self.request("GET", res.path(namespace), query=query)
        # Then the server ends the watch after timeout_seconds; the client-side read timeout
        # only catches a connection that died silently (``Connectivity`` or TCP keepalive
        # usually notice first).
        sock = getattr(getattr(resp.response, "connection", None), "sock", None)
        if sock is not None:
            sock.settimeout(read_timeout)
        return _HttpWatchStream(resp.response, self.connectivity)

    def _watch_http2(
        self, path: str, query: list[tuple[str, Any]], read_timeout: float
    ) -> WatchStream | None:
        """The watch as a stream of the shared HTTP/2 connections; None (and HTTP/1.1 from
        then on) when the server does not speak HTTP/2. Headers (credentials included, a
        refreshed token too) come from the client, as for every other request; the body
        fails after ``read_timeout`` s without data, as the HTTP/1.1 socket's read does."""
        assert self.watch_pool is not None
        _, url, headers, _, _ = self.api_client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        target = urlsplit(url)
        sent = time.monotonic()
        try:
            stream = self.watch_pool.open(
                target.path + (f"?{target.query}" if target.query else ""),
                list(headers.items()),
                self.request_timeout,
                read_timeout,
            )
        except NotHttp2 as exc:
            self.watch_pool.refused = True
            log.warning("%s: watches use one HTTP/1.1 connection each", exc)
            return None
        except Exception as exc:
            if _is_transport_error(exc):
                self.connectivity.failed()
            raise
        self.connectivity.answered(sent)
        status = stream.status or 0
        if not 200 <= status <= 299:
            try:
                body = stream.read(self.request_timeout)
            finally:
                stream.close()
            error = ApiException(
                status=status, reason=_reason(status), body=body.decode("utf-8", "replace")
            )
            # Case-insensitive, as urllib3's headers of an HTTP/1.1 answer: HTTP/2 names are
            # lower case, and ``retry.retry_after`` asks for "Retry-After".
            error.headers = urllib3.HTTPHeaderDict(
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in stream.headers]
            )
            raise error
        return _HttpWatchStream(stream, self.connectivity)

    def get_metadata(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None:
        """Only the object's metadata (PartialObjectMetadata), or None when it does not exist.

        What the reporter asks when it only needs an object's labels: a Secret's data never
        travels, and a DaemonSet's pod template neither.
        """
        try:
            return self.request_json("GET", res.path(namespace, name), accept=PARTIAL_METADATA)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None when it does not exist (404)."""
        try:
            obj = self.request_json("GET", res.path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        obj.setdefault("kind", res.kind)
        obj.setdefault("apiVersion", res.api_version)
        return obj

    def create(
        self,
        res: Resource,
        body: Obj,
        namespace: str | None = None,
        field_manager: str | None = None,
    ) -> Obj:
        query = [("fieldManager", field_manager)] if field_manager else None
        return self.request_json("POST", res.path(namespace), body=body, query=query)

    def replace(self, res: Resource, name: str, body: Obj, namespace: str | None = None) -> Obj:
        return self.request_json("PUT", res.path(namespace, name), body=body)

    def merge_patch_status(self, res: Resource, name: str, patch: Obj, field_manager: str) -> Obj:
        """JSON merge patch on an object's ``/status`` subresource."""
        return self.request_json(
            "PATCH",
            res.path(None, name) + "/status",
            body=patch,
            query=[("fieldManager", field_manager)],
            content_type="application/merge-patch+json",
        )


def _reason(status: int) -> str:
    """The reason phrase HTTP/1.1 would have carried (HTTP/2 has none)."""
    with contextlib.suppress(ValueError):
        return http.HTTPStatus(status).phrase
    return ""


def http2_watch_pool(api_client: client.ApiClient) -> H2Pool | None:
    """Shared HTTP/2 connections for the watches of ``api_client``'s cluster, or None where
    HTTP/2 is not used (plain http, a proxy): see ``reporter.h2watch``."""
    endpoint = endpoint_from(api_client.configuration)
    return H2Pool(endpoint, CONNECT_TIMEOUT) if endpoint is not None else None


CONNECTION_POOL_SIZE = 32


def configure(
    configuration: client.Configuration, pool_size: int = CONNECTION_POOL_SIZE
) -> client.Configuration:
    """No hidden client retries, and TCP keepalive, on every connection of the reporter.

    urllib3 retries failed reads of idempotent requests three times by default; on top of
    our own timeouts that would let a Lease renewal take several times its deadline.
    """
    configuration.retries = False
    # One connection per open watch plus the Lease, the status writer and Events. A smaller
    # pool drops the surplus each time a watch ends (its connection is not reused: a new TLS
    # handshake for the next watch), with a warning for each: 8,010 in 5 minutes at 100
    # deployments with the 32 the pool had for every layout (BENCHMARKS.md section 6).
    configuration.connection_pool_maxsize = pool_size
    configuration.socket_options = tcp_keepalive_socket_options(
        KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT
    )
    return configuration


def is_too_large_resource_version(exc: BaseException) -> bool:
    """The server's "Too large resource version" answer (504 with cause ResourceVersionTooLarge).

    It means the server (or its watch cache) has not caught up with a resourceVersion we saw
    elsewhere, e.g. from an API server that was ahead. Retrying the same version can go on
    forever; client-go re-lists instead, and so do we.
    """
    if getattr(exc, "status", None) != 504:
        return False
    body = getattr(exc, "body", None) or ""
    reason = str(getattr(exc, "reason", "") or "")
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return "ResourceVersionTooLarge" in text + reason or "Too large resource version" in (
        text + reason
    )


class KubeconfigError(Exception):
    """No usable cluster configuration; the message is one line meant for the operator."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def load_api_client(
    kubeconfig: str | None, pool_size: int = CONNECTION_POOL_SIZE
) -> client.ApiClient:
    """An ApiClient from an explicit kubeconfig, else in-cluster config, else $KUBECONFIG,
    keeping up to ``pool_size`` connections (see :func:`configure`).

    Integration tests run the reporter as a subprocess with a token-based kubeconfig for its
    ServiceAccount, so an explicit path always wins over the in-cluster environment.
    Failures raise ``KubeconfigError`` with a one-line reason: the client's own messages are
    misleading (a missing file reads "Invalid kube-config file. No configuration found.") and
    a traceback from a start-up mistake only hides the reason in a crash-looping pod's log.
    """
    if kubeconfig:
        try:
            with open(kubeconfig, encoding="utf-8") as f:
                f.read(1)
        except OSError as exc:
            raise KubeconfigError(
                f"cannot read kubeconfig {kubeconfig}: {exc.strerror or exc}"
            ) from exc
        try:
            configuration = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            return client.ApiClient(configure(configuration, pool_size))
        except Exception as exc:  # ConfigException, YAML errors, wrongly shaped documents
            raise KubeconfigError(f"invalid kubeconfig {kubeconfig}: {_first_line(exc)}") from exc
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configure(configuration, pool_size))
    except config.ConfigException:
        pass
    try:
        configuration = client.Configuration()
        config.load_kube_config(client_configuration=configuration)
        return client.ApiClient(configure(configuration, pool_size))
    except Exception as exc:
        raise KubeconfigError(
            "not running in a cluster and no usable kubeconfig ($KUBECONFIG or ~/.kube/config): "
            f"{_first_line(exc)}; pass --kubeconfig"
        ) from exc
