"""A real process that runs under a given program name (``exec -a``), for the rules that
read ``/proc/PID/cmdline`` (tools/cluster.py ``program_of``, ``runs_api_server``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def running_as(program: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``sleep`` whose ``argv[0]`` is ``program``, once it shows in ``/proc`` (read as raw
    bytes, not through the code under test); killed and reaped after."""
    argv0 = os.fsencode(program)
    proc = subprocess.Popen([b"bash", b"-c", b'exec -a "$0" sleep 600', argv0])
    try:
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != argv0:
            if proc.poll() is not None:
                raise RuntimeError(f"exec -a {program!r} exited: {proc.returncode}")
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()
