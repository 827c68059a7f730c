"""``make mutate``'s report (tools/mutate.py): mutmut's per-file results grouped by module."""

from __future__ import annotations

import json
import tomllib
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


def test_source_files_of_mutated_functions_and_methods() -> None:
    assert mutate.source_of_function("pmem_components.config.x_load_config") == (
        "pmem_components/config.py"
    )
    assert mutate.source_of_function("pmem_components.manifests.node.x_build") == (
        "pmem_components/manifests/node.py"
    )
    assert mutate.source_of_function("reporter.write.xǁStatusWriterǁreconcile") == (
        "reporter/write.py"
    )


def test_each_function_keeps_only_its_modules_own_tests() -> None:
    stats = {
        "pmem_components.config.x_load_config": [
            "tests/unit/test_config.py::test_defaults_are_the_reference_defaults",
            "tests/unit/test_bad_input.py::test_every_key_rejects_a_wrong_type_by_name[x]",
            "tests/unit/test_components.py::test_stack_outputs",
            "tests/unit/test_manifests.py::test_name_and_namespace",
        ],
        "pmem_components.manifests.node.x_build": [
            "tests/unit/test_manifests.py::test_name_and_namespace",
            "tests/unit/test_config.py::test_defaults_are_the_reference_defaults",
        ],
        "pmem_components.names.x_hyphened": ["tests/unit/test_config.py::test_x"],
    }
    assert mutate.own_tests_only(stats) == {
        "pmem_components.config.x_load_config": {
            "tests/unit/test_config.py::test_defaults_are_the_reference_defaults",
            "tests/unit/test_bad_input.py::test_every_key_rejects_a_wrong_type_by_name[x]",
        },
        "pmem_components.manifests.node.x_build": {
            "tests/unit/test_manifests.py::test_name_and_namespace",
        },
        # Not a module of the table: no tests, never run.
        "pmem_components.names.x_hyphened": set(),
    }


def test_mutmut_collects_exactly_the_own_test_files_and_they_exist() -> None:
    pyproject = tomllib.loads((mutate.PROJECT_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    selection = pyproject["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    own = [f for files in mutate.OWN_TESTS.values() for f in files]
    assert sorted(selection) == sorted(set(own))
    assert len(set(selection)) == len(selection), "a test file is collected once"
    for files in mutate.OWN_TESTS.values():
        assert len(set(files)) == len(files), "a test file is listed once per module"
    assert set(mutate.OWN_TESTS) == set(mutate.MODULES)
    for path in own:
        assert (mutate.PROJECT_DIR / path).is_file(), path
