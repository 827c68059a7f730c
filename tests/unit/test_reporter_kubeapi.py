"""RawApi over real HTTP against a tiny in-process fake API server (no cluster needed)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reporter import model
from reporter.kubeapi import RawApi
from reporter.observe import POD, SECRET
from reporter.write import KubeStatusApi

REQUESTS: list[tuple[str, str, dict, bytes]] = []


class Handler(BaseHTTPRequestHandler):
    def _reply(self, code: int, body: object, lines: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        data = (
            b"".join(json.dumps(e).encode() + b"\n" for e in body)
            if lines
            else json.dumps(body).encode()
        )
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        q = parse_qs(url.query)
        REQUESTS.append(("GET", url.path, q, b""))
        if url.path == "/api/v1/namespaces/ns/pods" and "watch" in q:
            self._reply(
                200,
                [
                    {
                        "type": "ADDED",
                        "object": {"metadata": {"name": "p2", "resourceVersion": "8"}},
                    },
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
                ],
                lines=True,
            )
        elif url.path == "/api/v1/namespaces/ns/pods":
            if "continue" in q:
                self._reply(
                    200,
                    {"items": [{"metadata": {"name": "p1"}}], "metadata": {"resourceVersion": "7"}},
                )
            else:
                self._reply(
                    200,
                    {
                        "items": [{"metadata": {"name": "p0"}}],
                        "metadata": {"continue": "tok", "resourceVersion": "7"},
                    },
                )
        elif url.path.endswith("/secrets/missing"):
            self._reply(404, {"kind": "Status", "code": 404})
        elif url.path.endswith("/secrets/forbidden"):
            self._reply(403, {"kind": "Status", "code": 403})
        else:
            self._reply(404, {})

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        REQUESTS.append(("PATCH", self.path, {"ct": self.headers["Content-Type"]}, body))
        self._reply(200, {"metadata": {"name": "x", "resourceVersion": "2"}})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[RawApi]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    conf.api_key = {"authorization": "Bearer t0ken"}
    REQUESTS.clear()
    yield RawApi(client.ApiClient(conf))
    server.shutdown()


def test_list_follows_continue_and_adds_kind(api: RawApi) -> None:
    items, rv = api.list(POD, "ns", label_selector="a=b,c in (d)")
    assert [i["metadata"]["name"] for i in items] == ["p0", "p1"]
    assert rv == "7" and items[0]["kind"] == "Pod" and items[0]["apiVersion"] == "v1"
    assert REQUESTS[0][2]["labelSelector"] == ["a=b,c in (d)"]
    assert REQUESTS[1][2]["continue"] == ["tok"]


def test_watch_streams_events_with_bookmarks(api: RawApi) -> None:
    events = list(api.watch(POD, "7", "ns", label_selector="a=b", timeout_seconds=5))
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    q = REQUESTS[0][2]
    assert q["watch"] == ["true"] and q["allowWatchBookmarks"] == ["true"]
    assert q["resourceVersion"] == ["7"] and q["timeoutSeconds"] == ["5"]


def test_get_maps_404_to_none_and_raises_others(api: RawApi) -> None:
    assert api.get(SECRET, "missing", "ns") is None
    with pytest.raises(ApiException) as err:
        api.get(SECRET, "forbidden", "ns")
    assert err.value.status == 403


def test_status_patch_is_a_merge_patch_on_the_status_subresource(api: RawApi) -> None:
    KubeStatusApi(api).patch_status("pmem-csi.intel.com", {"status": {"phase": "Running"}})
    method, path, headers, body = REQUESTS[0]
    assert method == "PATCH"
    assert path.startswith("/apis/pmem-csi.intel.com/v1beta1/deployments/pmem-csi.intel.com/status")
    assert headers["ct"] == "application/merge-patch+json"
    assert json.loads(body) == {"status": {"phase": "Running"}}


def test_in_cluster_credentials_need_no_kubeconfig_and_disable_hidden_retries(
    tmp_path, monkeypatch
):
    """As in its pod: the ServiceAccount token and CA from files, no kubeconfig anywhere."""
    from kubernetes.config import incluster_config

    from reporter import kubeapi

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    api_client = kubeapi.load_api_client(None)
    conf = api_client.configuration
    assert conf.host == "https://10.96.0.1:443"
    assert "sa-token" in str(conf.api_key) + str(conf.access_token or "")
    # No urllib3 retries on top of our timeouts (a Lease renewal must not take 4x as long),
    # and TCP keepalive so a dead connection is noticed.
    assert conf.retries is False
    assert any(opt[1] == socket.SO_KEEPALIVE for opt in conf.socket_options)
    # A pooled connection for every watch at once (13 kinds) and the requests beside them.
    pool_kw = api_client.rest_client.pool_manager.connection_pool_kw
    assert pool_kw["maxsize"] >= len(model.API_RESOURCES) + 3 + 3
