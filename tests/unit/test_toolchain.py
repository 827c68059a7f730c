"""The pins agree with each other: wrapper modules, stamped versions and Python packages."""

from __future__ import annotations

import re
from pathlib import Path

from tools import toolchain

TOOLS = toolchain.TOOLS_DIR


def _require(group: str, module: str) -> str:
    text = (TOOLS / group / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(\S+)", text, re.M)
    assert match, f"{module} not required in tools/{group}/go.mod"
    return match.group(1)


def _python_pin(package: str) -> str:
    text = (toolchain.PROJECT_DIR / "requirements.txt").read_text()
    match = re.search(rf"^{re.escape(package)}==(\S+)", text, re.M | re.I)
    assert match, f"{package} not pinned in requirements.txt"
    return match.group(1)


def test_kubernetes_version_matches_wrapper_and_staging_replacements() -> None:
    assert _require("kubernetes", "k8s.io/kubernetes") == toolchain.KUBERNETES_VERSION
    staging = toolchain.KUBERNETES_VERSION.replace("v1.", "v0.")
    replaced = re.findall(r"=> \S+ (v\S+)", (TOOLS / "kubernetes" / "go.mod").read_text())
    assert replaced and set(replaced) == {staging}


def test_etcd_and_kwok_versions_match_wrappers() -> None:
    assert _require("etcd", "go.etcd.io/etcd/server/v3") == toolchain.ETCD_VERSION
    assert _require("kwok", "sigs.k8s.io/kwok") == toolchain.KWOK_VERSION


def test_pulumi_cli_matches_python_sdk() -> None:
    assert _require("pulumi", "github.com/pulumi/pulumi/pkg/v3") == toolchain.PULUMI_VERSION
    assert _python_pin("pulumi") == toolchain.PULUMI_VERSION.lstrip("v")


def test_kubernetes_provider_matches_python_package() -> None:
    sdk = re.search(
        r"sdk/v4 => \S+ (v\S+)", (TOOLS / "pulumi-kubernetes" / "go.mod").read_text()
    )
    assert sdk and sdk.group(1) == toolchain.PULUMI_KUBERNETES_VERSION
    assert _python_pin("pulumi-kubernetes") == toolchain.PULUMI_KUBERNETES_VERSION.lstrip("v")


def test_cache_key_changes_when_a_pin_changes(tmp_path: Path, monkeypatch) -> None:
    group_dir = tmp_path / "demo"
    group_dir.mkdir()
    (group_dir / "go.mod").write_text("module x\nrequire a v1.0.0\n")
    monkeypatch.setattr(toolchain, "TOOLS_DIR", tmp_path)
    group = toolchain.Group("demo", {"x": "."})
    before = group.key()
    (group_dir / "go.mod").write_text("module x\nrequire a v1.0.1\n")
    assert group.key() != before


def test_cache_lives_outside_the_work_tree(monkeypatch) -> None:
    monkeypatch.delenv("PMEM_CSI_TOOLS_CACHE", raising=False)
    assert toolchain.PROJECT_DIR not in toolchain.cache_root().parents
