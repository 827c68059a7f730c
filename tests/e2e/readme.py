"""The README's shell blocks, for tests that run them exactly as an administrator copies them."""

from __future__ import annotations

import re

from tools import toolchain


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
