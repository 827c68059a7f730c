"""Small fixes of the program's checks: a rename from a deployment still configured
(``config.py``), the component URN of a library instance whose name has colons
(``preflight.py``), label rules on patched objects (``patches.py``), and the real node's
components entering their cgroup without a fork (``tools/realnode.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pmem_components import names, preflight
from pmem_components.config import ConfigError, load_config


def _problems(raw: dict[str, Any]) -> list[str]:
    """The problems ``load_config`` raises for ``raw``."""
    with pytest.raises(ConfigError) as info:
        load_config(raw, check_certificates=False)
    return info.value.problems


# --------------------------------------------------------------------------- renamedFrom


def test_a_rename_from_a_deployment_still_configured_is_refused_by_the_config() -> None:
    """Both the old and the new name configured: the rename would remove the old driver
    (the preflight plans it as a move) while the config still deploys it. Refused by the
    config's own cross-entry rules, which run before the preflight and any cluster change
    (also with ``preflight: false``)."""
    found = _problems(
        {
            "deployments": [
                {"name": "old.example.com", "namespace": "old"},
                {"name": "new.example.com", "renamedFrom": "old.example.com"},
            ]
        }
    )
    assert found == [
        'pmem-csi:deployments[1].renamedFrom: "old.example.com" is still configured '
        "(pmem-csi:deployments[0].name); a rename replaces the old deployment, so remove "
        "it from the config in the same update to rename it, or drop renamedFrom to run "
        "both"
    ]


def test_a_rename_from_the_default_name_of_an_entry_without_a_name_is_refused() -> None:
    """An entry without ``name`` is the default driver name: naming it in renamedFrom is
    renaming a deployment still configured."""
    found = _problems(
        {"deployments": [{"name": "new.example.com", "renamedFrom": "pmem-csi.intel.com"}, {}]}
    )
    assert [p.split(":", 2)[1] for p in found] == ["deployments[0].renamedFrom"]
    assert "(pmem-csi:deployments[1].name)" in found[0]


def test_a_rename_from_a_name_no_longer_configured_is_fine() -> None:
    stack = load_config(
        {
            "deployments": [
                {"name": "other.example.com", "namespace": "other"},
                {"name": "new.example.com", "renamedFrom": "old.example.com"},
            ]
        },
        check_certificates=False,
    )
    assert [d.renamed_from for d in stack.deployments] == [None, "old.example.com"]


# --------------------------------------------------------------------------- component URN


async def _pulumi_urns(component: str, child: str) -> tuple[str, str]:
    """The URNs Pulumi's own ``create_urn`` builds for a top-level ``PmemCsiDeployment``
    named ``component`` and its Deployment CR child named ``child``."""
    import pulumi

    from pmem_components.components import COMPONENT_TYPE

    parent = await pulumi.resource.create_urn(
        component, COMPONENT_TYPE, project="pmem-csi-pulumi", stack="prod"
    ).future()
    assert parent is not None
    cr_type = f"kubernetes:{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}:{names.CRD_KIND}"
    urn = await pulumi.resource.create_urn(child, cr_type, parent=parent).future()
    assert urn is not None
    return parent, urn


@pytest.mark.parametrize("component", ["east", "east:west", "cluster:a:b"])
def test_the_component_urn_of_a_library_cr_keeps_the_colons_of_the_components_name(
    component: str,
) -> None:
    """A library instance's children are named ``<component>:<driver>``: the component's
    name is all but the last colon's part (a driver name has none), not the part before
    the first colon, which named a URN that does not exist in the suggested
    ``pulumi state delete``."""
    driver = names.DEFAULT_DRIVER_NAME
    parent, child = asyncio.run(_pulumi_urns(component, f"{component}:{driver}"))
    assert preflight._component_urn(child) == parent


def test_the_component_urn_of_a_program_cr_is_named_after_the_driver() -> None:
    driver = names.DEFAULT_DRIVER_NAME
    parent, child = asyncio.run(_pulumi_urns(driver, driver))
    assert preflight._component_urn(child) == parent


def test_the_component_urn_of_a_cr_whose_components_name_holds_a_double_colon() -> None:
    """A URN's name is everything after its third ``::`` (stack, project and type hold none;
    a name may): the engine builds a child's URN from its parent's type, so the child of
    ``x::y`` is ``...::<component type>$<CR type>::x::y:<driver>``. (The SDK's
    ``create_urn`` cuts the parent at its last ``::`` and gets this case wrong; the engine,
    which names the registered children, does not.)"""
    from pmem_components.components import COMPONENT_TYPE

    cr_type = f"kubernetes:{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}:{names.CRD_KIND}"
    base = "urn:pulumi:prod::pmem-csi-pulumi::"
    child = f"{base}{COMPONENT_TYPE}${cr_type}::x::y:{names.DEFAULT_DRIVER_NAME}"
    assert preflight._component_urn(child) == f"{base}{COMPONENT_TYPE}::x::y"


# --------------------------------------------------------------------------- patched labels


def _patch_problems(*patches: dict[str, Any]) -> list[str]:
    """What the program's dry run of ``patches`` on the built objects refuses, as
    ``read_config`` runs it before the preflight and before anything is registered."""
    from pmem_components.components import check_patches

    stack = load_config(
        {"deployments": [{"name": "first.example.com", "patches": list(patches)}]},
        check_certificates=False,
    )
    return check_patches(stack.deployments[0], 0)


KEY = "pmem-csi:deployments[0].patches"


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"tier": "x\n"}}}},
            f'{KEY}[0]: metadata.labels["tier"]: is not a valid label value (got "x\\n")',
        ),
        (
            {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"/abc": "x"}}}},
            f'{KEY}[0]: metadata.labels["/abc"]: is not a valid label key',
        ),
        (
            {"kind": "Service", "mergePatch": {"metadata": {"labels": {"tier": "v" * 64}}}},
            f'{KEY}[0]: metadata.labels["tier"]: is not a valid label value (got "{"v" * 64}")',
        ),
        (
            {
                "kind": "StatefulSet",
                "jsonPatch": [
                    {"op": "add", "path": "/spec/template/metadata/labels/a b", "value": "x"}
                ],
            },
            f'{KEY}[0]: spec.template.metadata.labels["a b"]: is not a valid label key',
        ),
        (
            {"kind": "DaemonSet", "mergePatch": {"metadata": {"annotations": {"-x": "any"}}}},
            f'{KEY}[0]: metadata.annotations["-x"]: is not a valid annotation key',
        ),
    ],
    ids=["value-newline", "key-empty-prefix", "value-too-long", "template-key", "annotation"],
)
def test_a_patch_writing_a_label_the_api_server_refuses_is_named(
    patch: dict[str, Any], expected: str
) -> None:
    """A merge or JSON patch that writes a label the API server refuses passed the dry run
    and failed in the middle of ``pulumi up``; the patched objects' labels (and annotation
    keys) are checked by the config's label rule, naming the patch."""
    assert _patch_problems(patch) == [expected]


def test_a_bad_label_is_blamed_on_the_patch_that_wrote_it_last_and_may_be_repaired() -> None:
    """Only the final object counts (a later patch may repair a value), as for types; the
    patch blamed is the last that wrote the key."""
    bad = {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"tier": "x\n"}}}}
    good = {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"tier": "x"}}}}
    other = {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"b": "y"}}}}
    assert _patch_problems(bad, good) == []
    assert _patch_problems(good, other, bad) == [
        f'{KEY}[2]: metadata.labels["tier"]: is not a valid label value (got "x\\n")'
    ]


def test_valid_labels_and_annotations_written_by_patches_are_accepted() -> None:
    """Prefixed keys, an empty value, and an annotation key with capitals in its prefix (the
    API server lowers annotation keys before it checks them, not label keys)."""
    patch = {
        "kind": "DaemonSet",
        "mergePatch": {
            "metadata": {
                "labels": {"example.com/tier": "", "a_b.c-d": "V" * 63},
                "annotations": {"Example.COM/note": "free text\n"},
            },
            "spec": {"template": {"metadata": {"labels": {"example.com/x": "y"}}}},
        },
    }
    assert _patch_problems(patch) == []


# --------------------------------------------------------------------------- real node spawn


def test_a_real_node_component_enters_its_cgroup_through_a_shell_not_a_fork(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``_spawn`` enters the tracking cgroup by a ``sh -c`` prefix that writes 0 to its
    cgroup.procs and execs the command, never by ``preexec_fn``: with one, CPython forks
    rather than vfork, and a fork runs the gRPC library's fork handlers (the Pulumi SDK is
    loaded in the same test process), which crashed initdb's child the same way
    (tools/postgres.py). Run for real, a temporary file standing in for cgroup.procs: it
    holds "0", the program gets its arguments intact (spaces, quotes, ``$``, globs), runs
    in a session of its own, and keeps the descriptors passed."""
    from tools import realnode

    procs = tmp_path / "cgroup" / "pids" / realnode.TRACKING_CGROUP / "cgroup.procs"
    procs.parent.mkdir(parents=True)
    procs.write_text("")
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(realnode, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(realnode, "log_dir", lambda: logs)
    calls: list[dict[str, Any]] = []
    popen = subprocess.Popen

    def spy(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        calls.append(kwargs)
        return popen(cmd, **kwargs)

    monkeypatch.setattr(realnode.subprocess, "Popen", spy)
    args = ["a b", "it's", '"q"', "$HOME", "*", "", "-c"]
    script = (
        "import json, os, sys; "
        "fd = int(sys.argv[1]); os.fstat(fd); "
        "print(json.dumps([sys.argv[2:], os.getsid(0) == os.getpid()]))"
    )
    read_end, write_end = os.pipe()
    try:
        proc = realnode._spawn(
            "probe", [sys.executable, "-c", script, str(write_end), *args], pass_fds=(write_end,)
        )
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(read_end)
        os.close(write_end)
    ((kwargs,),) = [calls]
    assert kwargs.get("preexec_fn") is None
    assert kwargs["start_new_session"] is True
    assert kwargs["pass_fds"] == (write_end,)
    assert procs.read_text().strip() == "0"
    assert json.loads((logs / "probe.log").read_text()) == [args, True]


def test_a_real_node_component_that_cannot_enter_its_cgroup_never_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The exec follows the write only (``&&``): outside the tracking cgroup a component
    would escape the teardown, so the shell exits instead, its reason in the log."""
    from tools import realnode

    monkeypatch.setattr(realnode, "CGROUP_ROOT", tmp_path / "no-cgroup")
    monkeypatch.setattr(realnode, "log_dir", lambda: tmp_path)
    marker = tmp_path / "ran"
    proc = realnode._spawn("probe", ["/bin/sh", "-c", 'touch "$0"', str(marker)])
    assert proc.wait(timeout=30) != 0
    assert not marker.exists()
    assert "cgroup.procs" in (tmp_path / "probe.log").read_text()
