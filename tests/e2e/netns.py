"""Reach into a container's network namespace from the test process, one thread at a time.

Why: a pod has its own network namespace, and the runc harness gives the reporter one too;
but the local API server listens on the host's loopback. ``setns(CLONE_NEWNET)`` moves only
the calling thread, and a socket stays in the namespace it was created in. So a thread that
entered the pod's namespace can listen there (the API server's address as the pod sees it)
or connect there (the pod's probes and metrics), while the connections to the API server are
opened by threads that stayed on the host. Needs root (CAP_SYS_ADMIN), as runc does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

CLONE_NEWNET = 0x40000000
T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def _enter(pid: int) -> None:
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the network namespace of {pid}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(pid: int, fn: Callable[[], T]) -> T:
    """``fn()`` in a new thread inside ``pid``'s network namespace; its result or exception."""
    box: dict[str, Any] = {}

    def inner() -> None:
        try:
            _enter(pid)
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=inner, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class Forwarder:
    """Listens on ``listen`` inside ``pid``'s namespace; forwards to ``target`` on the host."""

    def __init__(self, pid: int, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self._accepted: queue.Queue[socket.socket | None] = queue.Queue()
        self._listener: socket.socket = run_in_netns(pid, lambda: self._listen(listen))
        self.connections = 0
        threading.Thread(target=self._accept, name="fwd-accept", daemon=True).start()
        # Created by this (host) thread, so it and the pumps it starts stay on the host.
        threading.Thread(target=self._dispatch, name="fwd-dispatch", daemon=True).start()

    @staticmethod
    def _listen(addr: tuple[str, int]) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(64)
        return sock

    def _accept(self) -> None:
        # accept() needs no namespace: the listening socket already lives in the pod's.
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                self._accepted.put(conn)
        self._accepted.put(None)

    def _dispatch(self) -> None:
        while (conn := self._accepted.get()) is not None:
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            self.connections += 1
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
