"""``/healthz``, ``/readyz`` and ``/metrics`` on one small HTTP server.

Liveness and readiness mean different things here: a replica whose watch loops run is alive
even while its caches are still listing (restarting it would not help), and it is ready once
every cache has listed, leader or not, so a rolling update never waits for leadership.
The standard library's threading HTTP server is enough for a probe and a scrape every few
seconds and adds no dependency.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class HealthServer:
    def __init__(
        self,
        port: int,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        registry: CollectorRegistry,
        host: str = "",
    ) -> None:
        checks = {"/healthz": healthy, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in checks:
                    try:
                        ok = checks[path]()
                    except Exception:
                        log.exception("%s check failed", path)
                        ok = False
                    self._send(200 if ok else 503, b"ok\n" if ok else b"not ok\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, name="http", daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
