"""The README's shell blocks, and a shell that runs them as an administrator types them."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tools import toolchain

# What an administrator's clone holds of the project, for tests that run the CLI in a copy.
PROJECT_FILES = ("Pulumi.yaml", "__main__.py", "requirements.txt")
PROJECT_DIRS = ("pmem_components", "crd")


def project_copy(root: Path) -> Path:
    """A copy of the project in ``root`` as an administrator's clone has it: the files the
    program needs and a ``.venv`` link to this checkout's, the virtualenv ``Pulumi.yaml`` names
    (the CLI's language host runs the program with it)."""
    src = toolchain.PROJECT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        shutil.copyfile(src / name, root / name)
    ignore = shutil.ignore_patterns("__pycache__")
    for name in PROJECT_DIRS:
        shutil.copytree(src / name, root / name, ignore=ignore)
    (root / ".venv").symlink_to(src / ".venv")
    return root


def sh_blocks(heading: str) -> list[list[str]]:
    """The non-empty command lines of each ``sh`` block under ``heading``, in order.

    The section ends at the next second-level heading, so a block moved to another section
    stops being run by the test that documents this one.
    """
    text = (toolchain.PROJECT_DIR / "README.md").read_text()
    start = text.index(heading) + len(heading)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else None]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


@dataclass
class Shell:
    """Runs command lines as an administrator's shell would, keeping every result."""

    cwd: Path
    env: dict[str, str]
    log: list[tuple[str, subprocess.CompletedProcess[str]]] = field(default_factory=list)

    def run(self, line: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["bash", "-c", line],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.log.append((line, result))
        if check:
            assert result.returncode == 0, (
                f"`{line}` exited {result.returncode}\n{result.stdout[-4000:]}\n"
                f"{result.stderr[-4000:]}"
            )
        return result

    def output(self, line: str) -> str:
        """stdout + stderr of the last run of ``line``."""
        for ran, result in reversed(self.log):
            if ran == line:
                return result.stdout + result.stderr
        raise KeyError(line)
