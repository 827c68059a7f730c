"""The reporter's fixes for control-plane faults (tests/e2e/test_control_plane_faults.py).

- A watch whose connection went silent is restarted as soon as the API server answers again
  after a failed request (``reporter.kubeapi.Connectivity``), and a watch request whose
  response headers never come fails after the ordinary request timeout.
- A 401/403 right after the API server was unreachable is retried, not reported.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reporter.kubeapi import Connectivity, RawApi
from reporter.metrics import Metrics
from reporter.observe import AUTH_WARMUP_SECONDS, POD, Informer

RELEASE = threading.Event()  # lets the fake server's hanging handlers finish at teardown
# How long a request to a path that never answers waits: its whole cost in these tests.
DEAD_TIMEOUT = 0.5


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path == "/api/v1/namespaces/silent/pods":  # a watch that goes quiet after headers
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            RELEASE.wait(30)
            return
        if path == "/api/v1/namespaces/noheaders/pods":  # nothing at all comes back
            RELEASE.wait(30)
            return
        body = json.dumps({"items": [], "metadata": {"resourceVersion": "1"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[RawApi]:
    RELEASE.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    conf.retries = False
    # The ordinary request timeout for requests the server answers (a short one could run out
    # on a loaded machine before the in-process server is scheduled); only the requests to a
    # path that never answers use DEAD_TIMEOUT (``api.with_timeout``).
    yield RawApi(client.ApiClient(conf))
    RELEASE.set()
    server.shutdown()


def test_a_watch_request_without_response_headers_fails_after_the_request_timeout(
    api: RawApi,
) -> None:
    with pytest.raises(urllib3.exceptions.ReadTimeoutError) as err:
        api.with_timeout(DEAD_TIMEOUT).watch(POD, "1", "noheaders", timeout_seconds=300)
    # The request timeout, not the watch's 300 s + 15 s.
    assert f"read timeout={DEAD_TIMEOUT})" in str(err.value)


def test_a_silent_watch_is_shut_down_once_the_api_server_answers_after_a_failure(
    api: RawApi,
) -> None:
    stream = api.watch(POD, "1", "silent", timeout_seconds=300)
    ended = threading.Event()
    outcome: list[object] = []

    def consume() -> None:
        try:
            outcome.extend(stream)
        except Exception as exc:
            outcome.append(exc)
        ended.set()

    threading.Thread(target=consume, daemon=True).start()
    assert not ended.wait(0.3)  # silent: the read blocks

    # A request on a dead path fails without an answer; a later one is answered.
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        api.with_timeout(DEAD_TIMEOUT).request("GET", "/api/v1/namespaces/noheaders/pods")
    assert not ended.is_set()
    api.list(POD, "ok")

    assert ended.wait(10), "the silent watch was not shut down"
    assert api.connectivity.recoveries == 1
    # A restart, not an error: the informer resumes quietly from its resourceVersion.
    assert outcome == []


class FakeStream:
    def __init__(self) -> None:
        self.closed = 0
        self.last_data = float("-inf")

    def close(self) -> None:
        self.closed += 1


def test_only_watches_silent_since_the_failure_are_restarted() -> None:
    recovered: list[bool] = []
    conn = Connectivity(lambda since: recovered.append(True))
    silent, talking = FakeStream(), FakeStream()
    conn.opened(silent)  # type: ignore[arg-type]
    conn.opened(talking)  # type: ignore[arg-type]
    conn.answered(time.monotonic())  # no failure before: nothing happens
    assert silent.closed == 0 and not recovered

    sent_before_failure = time.monotonic()
    conn.failed()
    conn.answered(sent_before_failure)  # an answer to a request sent before the outage
    assert silent.closed == 0 and not recovered

    talking.last_data = time.monotonic()  # an event arrived after the failure: alive
    sent = time.monotonic()
    conn.answered(sent)
    assert silent.closed == 1 and talking.closed == 0 and recovered == [True]
    conn.answered(time.monotonic())  # recovered once; no failure since
    assert silent.closed == 1 and conn.recoveries == 1


def test_a_refused_connection_counts_as_no_answer_but_an_http_error_does_not() -> None:
    from reporter.kubeapi import _is_transport_error

    assert _is_transport_error(urllib3.exceptions.NewConnectionError(None, "refused"))  # type: ignore[arg-type]
    assert _is_transport_error(ConnectionResetError())
    assert _is_transport_error(ApiException(status=0, reason="SSLError"))
    assert not _is_transport_error(ApiException(status=403, reason="Forbidden"))
    assert not _is_transport_error(urllib3.exceptions.ClosedPoolError(None, "closed"))  # type: ignore[arg-type]


# ------------------------------------------------------------------ 403 right after an outage


class ScriptedApi:
    """One list, then the scripted watch outcomes (exceptions raised in order)."""

    def __init__(self, watches: list[Exception]) -> None:
        self.watches = list(watches)

    def list(self, res, namespace=None, label_selector=None, field_selector=None, transform=None):
        return [], "1"

    def watch(self, *args, **kwargs):
        raise self.watches.pop(0)

    def get(self, res, name, namespace=None):
        return None


def test_forbidden_just_after_the_api_server_was_unreachable_is_retried_not_believed() -> None:
    now = [1000.0]
    stop = threading.Event()
    api = ScriptedApi(
        [
            urllib3.exceptions.ProtocolError("Response ended prematurely"),  # server went away
            ApiException(status=403, reason="Forbidden"),  # back, authorizer not loaded yet
            ApiException(status=403, reason="Forbidden"),  # still 403 long after: believed
        ]
    )
    inf = Informer(api, POD, lambda *a: None, Metrics(), namespace="ns", clock=lambda: now[0])
    seen: list[tuple[bool, str | None]] = []

    def wait(_seconds: float) -> bool:
        seen.append((inf.synced, inf.error))
        if len(seen) == 2:
            now[0] += AUTH_WARMUP_SECONDS + 1
        if len(seen) == 3:
            stop.set()
        return False

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    assert seen[0] == (True, None)  # the connection error
    assert seen[1] == (True, None)  # 403 within the warm-up: cache kept, nothing reported
    assert seen[2] == (False, "403 Forbidden")  # 403 long after: permissions really missing
