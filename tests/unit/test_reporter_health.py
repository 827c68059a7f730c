"""Probe and metrics endpoints, and the CLI's defaults."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

from reporter.__main__ import log_level, parse_args
from reporter.health import HealthServer
from reporter.metrics import Metrics
from reporter.schedule import merge_dirty


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_endpoints():
    metrics = Metrics()
    metrics.watch_restarts.labels(resource="pods").inc()
    state = {"ready": False}
    server = HealthServer(0, lambda: True, lambda: state["ready"], metrics.registry, "127.0.0.1")
    server.start()
    try:
        assert fetch(server.port, "/healthz")[0] == 200
        assert fetch(server.port, "/readyz")[0] == 503
        state["ready"] = True
        assert fetch(server.port, "/readyz")[0] == 200
        code, text = fetch(server.port, "/metrics")
        assert code == 200
        assert 'pmem_csi_reporter_watch_restarts_total{resource="pods"} 1.0' in text
        assert "pmem_csi_reporter_status_writes_total 0.0" in text
        assert "pmem_csi_reporter_change_to_write_seconds_bucket" in text
        assert fetch(server.port, "/nope")[0] == 404
    finally:
        server.stop()


def test_cli_defaults_and_log_levels():
    args = parse_args(["--deployment", "a", "--deployment", "b", "--metrics-port", "0"])
    assert args.deployment == ["a", "b"] and args.metrics_port == 0
    assert args.resync_seconds == 60 and args.kubeconfig is None and args.namespace is None
    assert log_level("0") == logging.WARNING and log_level("3") == logging.INFO
    assert log_level("5") == logging.DEBUG and log_level("debug") == logging.DEBUG


def test_merge_dirty_keeps_earliest_change():
    into = {"a": 5.0, "b": None}
    merge_dirty(into, {"a": 3.0, "b": 4.0, "c": None})
    assert into == {"a": 3.0, "b": 4.0, "c": None}


def test_healthz_turns_red_when_the_main_loop_stalls() -> None:
    """A writer stuck in a call must not hide behind the live Lease thread."""
    import threading
    import time
    from types import SimpleNamespace

    from reporter.__main__ import Reporter

    rep = Reporter.__new__(Reporter)
    rep.stop = threading.Event()
    rep.observer = SimpleNamespace(healthy=True)
    rep._leader_thread = SimpleNamespace(is_alive=lambda: True)  # type: ignore[assignment]
    rep.stall_seconds = 180.0
    rep.loop = SimpleNamespace(beat=time.monotonic())  # type: ignore[assignment]
    assert rep.healthy()
    rep.loop.beat = time.monotonic() - 181.0
    assert not rep.healthy()


def test_sigterm_handler_takes_no_lock_and_only_sets_stop() -> None:
    """The handler may interrupt the main thread inside a cache lock: it must not take one."""
    import os
    import signal
    import threading

    from reporter.__main__ import install_signal_handlers

    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    try:
        install_signal_handlers(stop)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])


def test_reporter_process_exits_on_sigterm(tmp_path) -> None:
    """Started against an unreachable API server (informers backing off), SIGTERM ends it."""
    import subprocess
    import sys
    from pathlib import Path

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reporter",
            "--kubeconfig",
            str(kubeconfig),
            "--deployment",
            "x",
            "--metrics-port",
            "0",
            "--log-level",
            "WARNING",
        ],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None and "serving" in proc.stdout.readline()
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
