"""Debian packages of host tools, installed with apt-get only when a tool is missing.

Shared by the image build (mmdebstrap, umoci, skopeo, runc) and the local PostgreSQL server
(postgresql): both need programs that no PyPI package or Go module ships, so the local
environment installs them from the machine's own apt sources, as root, and never when they
are already there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping


class HostPackageError(RuntimeError):
    """A host tool is missing and cannot be installed here; the message names the packages."""


def ensure(tools: Mapping[str, str], found: Callable[[str], bool] | None = None) -> None:
    """Install the Debian package of each missing tool (``{tool: package}``) with apt-get.

    ``found(tool)`` tells whether a tool is there (default: on PATH). Without root or apt-get,
    a missing tool is an error naming the packages to install.
    """
    present = found or (lambda tool: shutil.which(tool) is not None)
    missing = list(dict.fromkeys(pkg for tool, pkg in tools.items() if not present(tool)))
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HostPackageError(
            f"missing host tools {', '.join(missing)}: install the Debian packages "
            f"({' '.join(missing)}) as root"
        )
    print(f"[hostpkg] installing {' '.join(missing)} with apt-get", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *missing]

    def apt(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=env, capture_output=True, text=True)

    if apt(install).returncode != 0:
        # A fresh machine has no package lists yet.
        for cmd in (["apt-get", "update", "-q"], install):
            done = apt(cmd)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
                raise HostPackageError(f"{' '.join(cmd)} failed ({done.returncode}):\n{tail}")
    still = [tool for tool in tools if not present(tool)]
    if still:
        raise HostPackageError(
            f"apt-get installed {' '.join(missing)} but {', '.join(still)} not found"
        )
