"""The shell blocks of README.md and docs/*.md, and a shell that runs them as an administrator
types them."""

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


def doc_files() -> list[Path]:
    """The documents whose command blocks tests run: README.md and every docs/*.md."""
    root = toolchain.PROJECT_DIR
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _headings(text: str) -> list[tuple[int, str]]:
    """(offset, line) of each Markdown heading of ``text``, skipping fenced blocks."""
    found, fenced, offset = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.append((offset, line.rstrip("\n")))
        offset += len(line)
    return found


def doc_of(heading: str) -> Path:
    """The one document that has ``heading`` as a heading line; none or several is an error,
    so a section moved, renamed or repeated never leaves a test running the wrong blocks."""
    having = [
        doc for doc in doc_files() for _, line in _headings(doc.read_text()) if line == heading
    ]
    if len(having) != 1:
        names = ", ".join(
            sorted({str(doc.relative_to(toolchain.PROJECT_DIR)) for doc in having})
        )
        raise LookupError(f"heading {heading!r} appears {len(having)} times, not once: {names}")
    return having[0]


def sh_blocks(heading: str) -> list[list[str]]:
    """The non-empty command lines of each ``sh`` block under ``heading``, in order.

    ``heading`` (e.g. ``"## Choosing a state backend"``) is looked up in README.md and
    docs/*.md (``doc_of``). The section ends at the next heading of the same or a higher
    level, so a block moved to another section stops being run by the test that documents
    this one.
    """
    text = doc_of(heading).read_text()
    level = len(heading) - len(heading.lstrip("#"))
    headings = _headings(text)
    start = next(offset for offset, line in headings if line == heading) + len(heading)
    end = next(
        (
            offset
            for offset, line in headings
            if offset > start and len(line) - len(line.lstrip("#")) <= level
        ),
        len(text),
    )
    blocks = re.findall(r"^```sh\n(.*?)^```", text[start:end], re.M | re.S)
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
