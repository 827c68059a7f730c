"""``make mutate``'s report (tools/mutate.py): mutmut's per-file results grouped by module."""

from __future__ import annotations

import json
from pathlib import Path

from tools import mutate


def _meta(root: Path, source: str, codes: dict[str, int | None]) -> None:
    path = root / f"{source}.meta"
    path.parent.mkdir(parents=True, exist_ok=True)
    durations = {name: 0.5 for name, code in codes.items() if code is not None}
    path.write_text(json.dumps({"exit_code_by_key": codes, "durations_by_key": durations}))


def test_function_names_of_functions_and_methods() -> None:
    module = "pmem_components.preflight"
    assert mutate.function_of(f"{module}.x_plan__mutmut_8", module) == "plan"
    assert mutate.function_of(f"{module}.x__path__mutmut_1", module) == "_path"
    assert mutate.function_of(f"{module}.xǁ_Readerǁget__mutmut_3", module) == "_Reader.get"


def test_the_table_scores_decisions_and_leaves_out_the_preflights_io(tmp_path: Path) -> None:
    pf = "pmem_components.preflight"
    _meta(
        tmp_path,
        "pmem_components/preflight.py",
        {
            f"{pf}.x_plan__mutmut_1": 1,  # killed
            f"{pf}.x_plan__mutmut_2": -24,  # timeout: left out of the score
            f"{pf}.x_plan__mutmut_3": 0,  # survived
            f"{pf}.x_plan__mutmut_4": None,  # not checked yet
            f"{pf}.x_observe__mutmut_1": 33,  # I/O: not scored
            f"{pf}.xǁ_Readerǁget__mutmut_1": 0,  # I/O: not scored
        },
    )
    wr = "reporter.write"
    _meta(tmp_path, "reporter/write.py", {f"{wr}.x_merge_patch__mutmut_1": 33})
    found = list(mutate.mutants(tmp_path))
    assert {m.status for m in found} == {"killed", "timeout", "survived", "not checked", "no tests"}
    rows = {line.split(" | ")[0].lstrip("| "): line for line in mutate.table(found).splitlines()}
    assert rows["pmem_components/preflight.py (planning)"] == (
        "| pmem_components/preflight.py (planning) | 4 | 1 | 1 | 1 | 0 | 1 | 50.0 % | 2 |"
    )
    # A mutant without a test counts against the score.
    assert rows["reporter/write.py"] == "| reporter/write.py | 1 | 0 | 0 | 0 | 1 | 0 | 0.0 % | 0 |"
    assert rows["pmem_components/config.py"].endswith("| 0 | 0 | 0 | 0 | 0 | 0 | - | 0 |")
