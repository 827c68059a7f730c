"""The documents hold what the tests run and what their links point to.

End-to-end tests run the ``sh`` blocks of a section of README.md or docs/*.md
(``tests.e2e.readme.sh_blocks``). These checks fail without a cluster when such a section is
renamed, repeated, moved out of reach or loses a block, and when a relative link of the
documents points to a file or heading that is not there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.e2e import readme
from tests.e2e.readme import doc_files, doc_of, sh_blocks

PROJECT_DIR = Path(__file__).resolve().parents[2]
E2E = PROJECT_DIR / "tests" / "e2e"


def _sh_block_uses() -> list[tuple[str, str, int | None]]:
    """(test module, heading, blocks the test unpacks or None) for every ``sh_blocks`` call of
    tests/e2e, the heading resolved from a literal or a module-level string constant."""
    uses = []
    for path in sorted(E2E.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        unpacked = {
            id(node.value): len(node.targets[0].elts)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "sh_blocks"
            ):
                continue
            (arg,) = node.args
            if isinstance(arg, ast.Constant):
                heading = arg.value
            else:
                assert isinstance(arg, ast.Name) and arg.id in constants, (
                    f"{path.name}:{node.lineno}: sh_blocks needs a literal heading or a "
                    "module-level constant, so that this test can check it"
                )
                heading = constants[arg.id]
            uses.append((path.name, heading, unpacked.get(id(node))))
    return uses


USES = _sh_block_uses()


def test_the_tests_that_run_documented_blocks_are_found() -> None:
    modules = {module for module, _, _ in USES}
    assert {"test_cli.py", "test_cli_interruptions.py", "test_team_backend.py"} <= modules


@pytest.mark.parametrize(
    ("module", "heading", "unpacked"), USES, ids=[f"{m}:{h}" for m, h, _ in USES]
)
def test_each_heading_a_test_runs_is_in_one_document_with_its_blocks(
    module: str, heading: str, unpacked: int | None
) -> None:
    doc_of(heading)  # exactly one document has it, exactly once
    blocks = sh_blocks(heading)
    assert blocks, f"{module}: no sh block under {heading!r}"
    if unpacked is not None:
        assert len(blocks) == unpacked, (
            f"{module} unpacks {unpacked} blocks of {heading!r}, the document has {len(blocks)}"
        )


def test_a_heading_in_no_document_or_in_two_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(LookupError, match="appears 0 times"):
        doc_of("## No such section")
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.md", "b.md"):
        (docs / name).write_text("# Title\n\n## Twice\n\n```sh\necho hi\n```\n")
    monkeypatch.setattr(readme.toolchain, "PROJECT_DIR", tmp_path)
    monkeypatch.setattr(readme, "doc_files", lambda: sorted(docs.glob("*.md")))
    with pytest.raises(LookupError, match=r"appears 2 times, not once: docs/a.md, docs/b.md"):
        doc_of("## Twice")
    (docs / "b.md").write_text("# Other\n")
    assert doc_of("## Twice") == docs / "a.md"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text."""
    anchors: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            n, candidate = 0, slug
            while candidate in anchors:
                n += 1
                candidate = f"{slug}-{n}"
            anchors.add(candidate)
    return anchors


def _links(text: str) -> list[str]:
    """The targets of the Markdown links outside code."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


DOCS = [*doc_files(), PROJECT_DIR / "BENCHMARKS.md"]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(PROJECT_DIR)) for d in DOCS])
def test_relative_links_point_to_a_file_and_heading_that_exist(doc: Path) -> None:
    broken = []
    for target in _links(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        found = file.exists() and (
            not anchor or (file.suffix == ".md" and anchor in _anchors(file.read_text()))
        )
        if not found:
            broken.append(target)
    assert not broken, f"{doc.name}: broken links {broken}"
