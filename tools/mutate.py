"""Mutation testing of the pure core: ``make mutate`` (by hand; not part of ``make test``).

mutmut (pinned in requirements-dev.txt, configured under ``[tool.mutmut]`` in pyproject.toml)
copies the code into ``mutants/`` (git-ignored), changes one thing at a time inside the
functions of the modules below (a ``<`` into ``<=``, a string into ``"XX...XX"``, an ``and``
into ``or``, an argument into ``None``) and runs the unit tests that cover that function
against each change, only those in its module's own test files (``OWN_TESTS``). A change no
test notices ("survived") marks a behaviour that no test pins. docs/testing.md records the
scores and explains each survivor that is left.

    python -m tools.mutate run        # fresh run (removes mutants/ first), then the table
    python -m tools.mutate run --keep # continue the last run (mutants not checked yet)
    python -m tools.mutate run --again-survivors  # the last run's survivors against new tests
    python -m tools.mutate run 'pmem_components.takeover.*'  # these mutants again (globs)
    python -m tools.mutate run --keep --sample 150  # a seeded random sample per module
    python -m tools.mutate report --sample 150      # ... and its score per module
    python -m tools.mutate report     # the table of the last run
    python -m tools.mutate survivors [PATTERN]  # each surviving mutant's diff
    python -m tools.mutate cost TEST...  # a mutant's CPU cost, mutmut's way and this one

Why a wrapper: mutmut reports per file and counts the preflight's cluster reading
(``observe`` and friends, exercised by the end-to-end tests) like its planning; this groups
the scores by the modules issue 17 names and scores only their pure decisions. And it runs
each module's mutants against that module's own test files only (``OWN_TESTS``): mutmut
would run every unit test that merely passes through the mutated function (a Pulumi-mock
component test through config.py), which made a full run take hours. Last, it runs each
mutant's tests inside one pytest session collected before the first mutant
(``in_session_runner``) instead of mutmut's fresh ``pytest.main`` per mutant, whose start
cost more CPU than most mutants' tests (docs/testing.md, "Speed").
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
MUTANTS_DIR = PROJECT_DIR / "mutants"

# Module in the table -> the source files it covers (globs, as in [tool.mutmut] only_mutate).
MODULES: dict[str, tuple[str, ...]] = {
    "pmem_components/config.py": ("pmem_components/config.py",),
    "pmem_components/patches.py": ("pmem_components/patches.py",),
    "pmem_components/preflight.py (planning)": ("pmem_components/preflight.py",),
    "pmem_components/takeover.py": ("pmem_components/takeover.py",),
    "pmem_components/fieldowners.py": ("pmem_components/fieldowners.py",),
    "pmem_components/manifests/": ("pmem_components/manifests/*.py",),
    "reporter/status.py": ("reporter/status.py",),
    "reporter/write.py": ("reporter/write.py",),
}

# Module in the table -> its own unit test files: the tests written to pin that module's
# behaviour. A mutant of the module runs only those of them that call the mutated function
# (mutmut's stats run says which), never the tests of other modules that merely pass through
# it. Sound in one direction: a mutant these tests kill is killed; a mutant that survives them
# may be caught elsewhere, but then the module's own tests miss a behaviour of it, a gap to
# close in its own test files. A file may pin several modules (test_small_fixes_program.py:
# one fix each in config, preflight and patches) and is then listed under each; a mutant
# runs only the tests of that file that call the mutated function, its module's. The union
# is [tool.mutmut] pytest_add_cli_args_test_selection in pyproject.toml, each file once
# (tests/unit/test_mutate.py checks that they agree).
OWN_TESTS: dict[str, tuple[str, ...]] = {
    "pmem_components/config.py": (
        "tests/unit/test_config.py",
        "tests/unit/test_bad_input.py",
        "tests/unit/test_config_checks.py",
        "tests/unit/test_config_sections.py",
        "tests/unit/test_config_messages.py",
        "tests/unit/test_small_fixes_program.py",
        "tests/unit/test_review_stop28.py",
    ),
    "pmem_components/patches.py": (
        "tests/unit/test_patches.py",
        "tests/unit/test_patches_mutants.py",
        "tests/unit/test_bad_input_certs_patches.py",
        "tests/unit/test_patchtypes.py",
        "tests/unit/test_small_fixes_program.py",
        "tests/unit/test_review_stop28.py",
    ),
    "pmem_components/preflight.py (planning)": (
        "tests/unit/test_preflight.py",
        "tests/unit/test_preflight_mutants.py",
        "tests/unit/test_preflight_identity.py",
        "tests/unit/test_small_fixes_program.py",
    ),
    "pmem_components/takeover.py": (
        "tests/unit/test_takeover.py",
        "tests/unit/test_takeover_mutants.py",
        "tests/unit/test_takeover_stale.py",
    ),
    "pmem_components/fieldowners.py": (
        "tests/unit/test_fieldowners.py",
        "tests/unit/test_fieldowners_mutants.py",
    ),
    "pmem_components/manifests/": (
        "tests/unit/test_manifests.py",
        "tests/unit/test_crd.py",
        "tests/unit/test_crd_mutants.py",
        "tests/unit/test_bundle_mutants.py",
        "tests/unit/test_driver_rbac_reference.py",
        "tests/unit/test_reporter_rbac.py",
        "tests/unit/test_reporter_manifest_mutants.py",
    ),
    "reporter/status.py": (
        "tests/unit/test_status.py",
        "tests/unit/test_status_mutants.py",
        "tests/unit/test_status_garbage.py",
        "tests/unit/test_status_scale.py",
        "tests/unit/test_status_truth.py",
        "tests/unit/test_reporter_trim.py",
        "tests/unit/test_small_fixes_reporter_status.py",
    ),
    "reporter/write.py": (
        "tests/unit/test_reporter_write.py",
        "tests/unit/test_write_mutants.py",
        "tests/unit/test_reporter_write_timing.py",
        "tests/unit/test_reporter_node_events.py",
        "tests/unit/test_reporter_conflict.py",
        "tests/unit/test_reporter_event_queue.py",
        "tests/unit/test_small_fixes_reporter_write.py",
    ),
}


def source_of_function(mangled: str) -> str:
    """mutmut's key of a mutated function -> its source file:
    ``pmem_components.manifests.node.x_build`` -> ``pmem_components/manifests/node.py``."""
    parts = mangled.split(".")
    while parts and not parts[-1].startswith(("x_", "xǁ")):
        parts.pop()
    return "/".join(parts[:-1]) + ".py"


def own_tests_only(tests_by_function: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """mutmut's function -> tests map, each function keeping only its module's own tests
    (``OWN_TESTS``); a function of a file outside ``MODULES`` keeps none."""
    selected: dict[str, set[str]] = {}
    for function, tests in tests_by_function.items():
        module = module_of(source_of_function(function))
        own = OWN_TESTS.get(module, ()) if module else ()
        selected[function] = {t for t in tests if t.split("::", 1)[0] in own}
    return selected


# Functions that do I/O rather than decide: mutated (mutmut cannot leave them out without
# markers in the code) but not scored. The end-to-end tests run them against a cluster.
NOT_SCORED = {
    "pmem_components/preflight.py": (
        "_observed",
        "_Reader.*",
        "observe",
        "run",
    ),
}

# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into what the table shows.
KILLED, SURVIVED, NO_TESTS, TIMEOUT, NOT_CHECKED, OTHER = (
    "killed",
    "survived",
    "no tests",
    "timeout",
    "not checked",
    "other",
)
_STATUS = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, None: NOT_CHECKED}
_TIMEOUT_CODES = {36, -24, 24, 152, 255}


def status_of(exit_code: int | None) -> str:
    if exit_code in _TIMEOUT_CODES:
        return TIMEOUT
    return _STATUS.get(exit_code, OTHER)


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's: pmem_components.preflight.x_plan__mutmut_8
    source: str  # pmem_components/preflight.py
    function: str  # plan, or Class.method
    status: str
    seconds: float  # wall time of its test run (0 when none ran)


def function_of(mutant_name: str, module: str) -> str:
    """``pkg.mod.x_plan__mutmut_8`` -> ``plan``; ``pkg.mod.xǁCǁm__mutmut_1`` -> ``C.m``."""
    local = mutant_name[len(module) + 1 :].rsplit("__mutmut_", 1)[0]
    if local.startswith("xǁ"):
        return ".".join(part for part in local[2:].split("ǁ") if part)
    return local.removeprefix("x_")


def mutants(root: Path = MUTANTS_DIR) -> Iterator[Mutant]:
    """Every mutant of the last run, from mutmut's per-file ``.meta`` results."""
    for meta_path in sorted(root.rglob("*.py.meta")):
        source = meta_path.relative_to(root).as_posix().removesuffix(".meta")
        module = source.removesuffix(".py").replace("/", ".")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        durations = meta.get("durations_by_key") or {}
        for name, code in (meta.get("exit_code_by_key") or {}).items():
            yield Mutant(
                name,
                source,
                function_of(name, module),
                status_of(code),
                float(durations.get(name) or 0.0),
            )


def module_of(source: str) -> str | None:
    for module, patterns in MODULES.items():
        if any(fnmatch.fnmatch(source, p) for p in patterns):
            return module
    return None


def scored(m: Mutant) -> bool:
    return not any(fnmatch.fnmatch(m.function, p) for p in NOT_SCORED.get(m.source, ()))


SAMPLE_SEED = 17


def sample(all_mutants: list[Mutant], size: int) -> set[str]:
    """A seeded random sample of ``size`` scored mutants per module (all of a smaller one):
    a run that checks only these estimates each module's score in a fraction of the time."""
    chosen: set[str] = set()
    for module in MODULES:
        names = sorted(m.name for m in all_mutants if module_of(m.source) == module and scored(m))
        chosen.update(random.Random(SAMPLE_SEED).sample(names, min(size, len(names))))
    return chosen


def _score(mutants_: list[Mutant]) -> tuple[str, int]:
    """Killed / (killed + survived + no tests). Timeouts are left out: on a loaded machine a
    slow survivor times out too, so a timeout is neither until checked with a longer limit."""
    counts = Counter(m.status for m in mutants_)
    decided = counts[KILLED] + counts[SURVIVED] + counts[NO_TESTS]
    return (f"{100 * counts[KILLED] / decided:.1f} %" if decided else "-"), decided


def table(all_mutants: list[Mutant], sampled: set[str] | None = None) -> str:
    """The per-module scores as a Markdown table (see ``_score``); with ``sampled``, also the
    score over the sampled mutants and how many of them it is made of."""
    head = "| module | mutants | killed | timeout | survived | no tests | not checked | score "
    rule = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
    if sampled is not None:
        head += "| sample score (of) "
        rule += "| ---: "
    rows = [head + "| test time (s) |", rule + "| ---: |"]
    for module in MODULES:
        mine = [m for m in all_mutants if module_of(m.source) == module and scored(m)]
        counts = Counter(m.status for m in mine)
        score, _ = _score(mine)
        row = (
            f"| {module} | {len(mine)} | {counts[KILLED]} | {counts[TIMEOUT]} "
            f"| {counts[SURVIVED]} | {counts[NO_TESTS]} | {counts[NOT_CHECKED]} | {score} "
        )
        if sampled is not None:
            in_sample = [m for m in mine if m.name in sampled]
            sample_score, checked = _score(in_sample)
            row += f"| {sample_score} ({checked} of {len(in_sample)}) "
        rows.append(row + f"| {sum(m.seconds for m in mine):.0f} |")
    return "\n".join(rows)


def survivors(pattern: str) -> None:
    """Print the diff of each scored mutant that survived (or had no test)."""
    os.chdir(PROJECT_DIR)
    from mutmut.__main__ import get_diff_for_mutant

    for m in mutants():
        if m.status not in (SURVIVED, NO_TESTS) or not scored(m):
            continue
        if not fnmatch.fnmatch(m.name, pattern) and not fnmatch.fnmatch(m.source, pattern):
            continue
        diff = get_diff_for_mutant(m.name, path=Path(m.source))
        changed = [
            line
            for line in diff.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
        print(f"## {m.name} ({m.status})")
        print("\n".join(changed))


def run(
    keep: bool,
    children: int,
    again_survivors: bool = False,
    sample_size: int | None = None,
    only: list[str] | None = None,
    per_mutant_pytest: bool = False,
) -> int:
    """A mutmut run; ``again_survivors``: only the last run's survivors (after new tests: a
    killed mutant stays killed when tests are only added); ``sample_size``: only the sampled
    mutants not checked yet (or timed out, checked again with the current limit)."""
    names: list[str] = list(only or [])
    sampled: set[str] | None = None
    if names:
        pass  # these mutants (names or globs), checked again
    elif again_survivors:
        names = [m.name for m in mutants() if m.status in (SURVIVED, NO_TESTS) and scored(m)]
        if not names:
            print("no survivors to run again")
            return 0
    elif sample_size is not None:
        found = list(mutants())
        if not found:
            print("a sample needs the mutants of a first run: run without --sample first")
            return 1
        sampled = sample(found, sample_size)
        names = [m.name for m in found if m.name in sampled and m.status in (NOT_CHECKED, TIMEOUT)]
        if not names:
            print(table(found, sampled))
            return 0
    elif not keep and MUTANTS_DIR.exists():
        shutil.rmtree(MUTANTS_DIR)
    started = time.monotonic()
    cpu_before = os.times()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.mutate",
            "mutmut",
            *(["--per-mutant-pytest"] if per_mutant_pytest else []),
            "run",
            "--max-children",
            str(children),
            *names,
        ],
        cwd=PROJECT_DIR,
        check=False,
    )
    wall = time.monotonic() - started
    cpu_after = os.times()
    cpu = sum(
        getattr(cpu_after, f) - getattr(cpu_before, f) for f in ("children_user", "children_system")
    )
    print()
    print(table(list(mutants()), sampled))
    print(f"\nwall time {wall / 60:.1f} min, CPU time {cpu / 60:.1f} min, {children} workers")
    return done.returncode


# What a mutant's child process costs before its first test (measured, docs/testing.md "Speed"):
# a fresh ``pytest.main`` per mutant (mutmut's way) parses the options, registers the plugins
# and conftests, parses their fixtures and collects the test files again, about 0.3 to 0.4
# CPU-seconds, more than most of the tests it then runs. ``InSessionRunner`` does all of that
# once, in the process that mutmut forks its children from, and a child only runs its items.
PYTEST_ARGS = ["--rootdir=.", "--tb=native", "-q", "-p", "no:randomly", "-p", "no:random-order"]


def failed(reports: Iterable[object]) -> bool:
    """Whether any phase (setup, call, teardown) of a test failed, as pytest counts it: an
    error in a fixture fails the test as much as a failed assertion."""
    return any(getattr(r, "failed", False) for r in reports)


def in_session_runner() -> type:
    """mutmut's ``PytestRunner`` with the mutants' test runs inside one collected session.

    ``collect`` (in mutmut's main process, once, before it forks the first mutant's child)
    configures pytest with mutmut's own arguments and collects the selected test files; each
    mutant's child (a fork, so the session is a copy of its own) runs its tests through
    pytest's ``runtestprotocol``, fastest first as mutmut orders them, and stops at the first
    one that fails (mutmut's ``-x``): exit code 1 (killed) or 0 (survived). The test modules
    are the same objects as under ``pytest.main`` in a fork (both import them once, in the
    parent), and the mutant is chosen at call time (``MUTANT_UNDER_TEST``), so a verdict is
    the same; ``run --per-mutant-pytest`` keeps mutmut's way to compare. The clean run, the
    forced-fail run and the stats stay mutmut's own ``pytest.main`` runs."""
    from mutmut.runners.harness import PytestRunner
    from mutmut.utils.file_utils import change_cwd

    class InSessionRunner(PytestRunner):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.items: dict[str, object] = {}

        def collect(self) -> None:
            from _pytest.config import _prepareconfig
            from _pytest.main import Session

            args = [*PYTEST_ARGS, *self._pytest_add_cli_args_test_selection]
            with change_cwd("mutants"):
                pytest_config = _prepareconfig([*args, *self._pytest_add_cli_args])
                pytest_config._do_configure()
                session = Session.from_config(pytest_config)
                pytest_config.hook.pytest_sessionstart(session=session)
                session.perform_collect()
                # The capture plugin captures this process's output from the start; the
                # children capture around each test phase themselves.
                capture = pytest_config.pluginmanager.getplugin("capturemanager")
                if capture is not None:
                    capture.suspend_global_capture(in_=True)
            self.items = {item.nodeid: item for item in session.items}

        def run_tests(self, *, mutant_name: str | None, tests: Iterable[str]) -> int:
            tests = list(tests)
            if mutant_name is None or not self.items or not set(tests) <= self.items.keys():
                return int(super().run_tests(mutant_name=mutant_name, tests=tests))
            from _pytest.runner import runtestprotocol

            items = [self.items[t] for t in tests]
            with change_cwd("mutants"):
                for item, next_item in zip(items, [*items[1:], None], strict=True):
                    if failed(runtestprotocol(item, nextitem=next_item, log=False)):
                        return 1
            return 0 if items else 5

    return InSessionRunner


def mutmut_with_own_tests(argv: list[str]) -> int:
    """mutmut's command line, in this process, with each mutant's tests cut down to its
    module's own (``own_tests_only``) once mutmut has collected or loaded its stats. Only
    the copy in memory is cut: mutants/mutmut-stats.json keeps every test, so a changed
    ``OWN_TESTS`` applies to the next run without collecting the stats again. The mutants'
    test runs go through ``in_session_runner`` unless ``argv`` starts with
    ``--per-mutant-pytest``."""
    import mutmut.__main__ as mutmut_main
    from mutmut.state import state

    per_mutant_pytest = argv[:1] == ["--per-mutant-pytest"]
    argv = argv[1:] if per_mutant_pytest else argv
    if not per_mutant_pytest:
        mutmut_main.get_mutant_runner = _in_session_fork_runner

    # The tests import ``tools`` (conftest.py) from mutants/, as under plain mutmut; this
    # process imported it from the checkout to get here.
    for name in [n for n in sys.modules if n == "tools" or n.startswith("tools.")]:
        del sys.modules[name]
    collect_or_load_stats = mutmut_main.collect_or_load_stats

    def collect_or_load_then_select(*args: object, **kwargs: object) -> None:
        collect_or_load_stats(*args, **kwargs)  # type: ignore[arg-type]
        mine = own_tests_only(state().tests_by_mangled_function_name)
        state().tests_by_mangled_function_name = defaultdict(set, mine)

    mutmut_main.collect_or_load_stats = collect_or_load_then_select
    try:
        mutmut_main.cli.main(argv, prog_name="mutmut", standalone_mode=False)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0


def forced_fail_in_session(test_runner: object) -> None:
    """mutmut's forced-fail check for the session's way: with every mutated function
    raising (the mutant ``fail``), the collected tests must fail, in a fork as a mutant's."""
    from mutmut.mutation.trampoline import set_mutant_under_test

    pid = os.fork()
    if pid == 0:
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child exits)
        set_mutant_under_test("fail")
        tests = list(test_runner.items)  # type: ignore[attr-defined]
        os._exit(test_runner.run_tests(mutant_name="fail", tests=tests))  # type: ignore[attr-defined]
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 1:
        raise SystemExit(f"the forced-fail run in the collected session exited {code}, not 1")
    print("    the forced-fail run in the collected session failed, as it must")


def _in_session_fork_runner(max_workers: int = 1) -> object:
    """mutmut's ``ForkRunner`` around an ``in_session_runner``, which collects the session
    when mutmut starts the runner (after its clean and forced-fail runs, right before the
    first mutant's fork; mutmut then freezes the garbage collector's view of it)."""
    from mutmut.configuration import config
    from mutmut.workers.isolation import ForkRunner

    test_runner = in_session_runner()()
    fork_runner = ForkRunner(max_workers=max_workers, test_runner=test_runner, debug=config().debug)
    start = fork_runner.startup

    def collect_then_start() -> None:
        test_runner.collect()
        forced_fail_in_session(test_runner)
        start()

    fork_runner.startup = collect_then_start  # type: ignore[method-assign]
    return fork_runner


def cost(tests: list[str], repeat: int) -> int:
    """CPU-seconds of one mutant's child process, both ways: mutmut's fresh ``pytest.main``
    per mutant and ``in_session_runner``'s collected session, each ``repeat`` times, with the
    original code (no mutant) in ``mutants/``, from a parent warmed as mutmut's is (the
    selected test files imported, the garbage collector frozen). Prints each way's median."""
    import gc
    import resource

    from mutmut.runners.harness import PytestRunner

    os.chdir(PROJECT_DIR)
    for name in [n for n in sys.modules if n == "tools" or n.startswith("tools.")]:
        del sys.modules[name]  # the tests import ``tools`` from mutants/, as under mutmut
    sys.path.insert(0, str(MUTANTS_DIR))
    runner = in_session_runner()()
    runner.collect()
    gc.freeze()
    ways = {
        "pytest.main per mutant (mutmut's way)": lambda: PytestRunner.run_tests(
            runner, mutant_name=None, tests=tests
        ),
        "one collected session (tools.mutate's way)": lambda: runner.run_tests(
            mutant_name="", tests=tests
        ),
    }
    for label, run_tests in ways.items():
        cpu: list[float] = []
        codes: set[int] = set()
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            pid = os.fork()
            if pid == 0:
                sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child exits)
                os._exit(int(run_tests()))
            codes.add(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        cpu.sort()
        print(f"{label}: {cpu[len(cpu) // 2]:.3f} CPU-s (median of {repeat}), exit {codes}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["mutmut"]:  # what ``run`` starts: not for use by hand
        return mutmut_with_own_tests(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tools.mutate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run mutmut, then print the table")
    run_p.add_argument("--keep", action="store_true", help="keep mutants/ (continue a run)")
    run_p.add_argument(
        "--again-survivors", action="store_true", help="run the last run's survivors again"
    )
    run_p.add_argument("--sample", type=int, help="check only a random sample per module")
    run_p.add_argument("--children", type=int, default=os.cpu_count() or 2)
    run_p.add_argument(
        "--per-mutant-pytest",
        action="store_true",
        help="mutmut's own way: a fresh pytest.main per mutant (slower; to compare verdicts)",
    )
    run_p.add_argument(
        "mutants", nargs="*", help="only these mutants (names or globs), checked again"
    )
    report_p = sub.add_parser("report", help="the table of the last run")
    report_p.add_argument("--sample", type=int, help="add the score of this sample per module")
    surv_p = sub.add_parser("survivors", help="diffs of the surviving mutants")
    surv_p.add_argument("pattern", nargs="?", default="*", help="mutant name or file glob")
    cost_p = sub.add_parser("cost", help="a mutant's CPU cost, mutmut's way and this one")
    cost_p.add_argument("tests", nargs="+", help="test node ids (tests/unit/...::test_x)")
    cost_p.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(
            args.keep,
            args.children,
            args.again_survivors,
            args.sample,
            args.mutants,
            args.per_mutant_pytest,
        )
    if not MUTANTS_DIR.is_dir():
        print("no mutants/ yet: run `make mutate` first", file=sys.stderr)
        return 1
    if args.command == "cost":
        return cost(args.tests, args.repeat)
    if args.command == "report":
        found = list(mutants())
        print(table(found, sample(found, args.sample) if args.sample else None))
    else:
        survivors(args.pattern)
    return 0


if __name__ == "__main__":
    sys.exit(main())
