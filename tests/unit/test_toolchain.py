"""The pins agree with each other: wrapper modules, stamped versions and Python packages."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
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


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


def test_pulumi_cli_and_python_sdk_are_the_pinned_pair() -> None:
    assert _require("pulumi", "github.com/pulumi/pulumi/pkg/v3") == toolchain.PULUMI_VERSION
    assert _require("pulumi", "github.com/pulumi/pulumi/sdk/v3") == toolchain.PULUMI_VERSION
    assert _python_pin("pulumi") == toolchain.PULUMI_PYTHON_SDK_VERSION
    # A CLI runs programs on older SDKs, not on newer ones (an SDK may ask for RPCs or monitor
    # features the engine does not have yet).
    assert _release(toolchain.PULUMI_PYTHON_SDK_VERSION) <= _release(toolchain.PULUMI_VERSION)


def test_kubernetes_provider_matches_python_package() -> None:
    sdk = re.search(
        r"sdk/v4 => \S+ (v\S+)", (TOOLS / "pulumi-kubernetes" / "go.mod").read_text()
    )
    assert sdk and sdk.group(1) == toolchain.PULUMI_KUBERNETES_VERSION
    assert _python_pin("pulumi-kubernetes") == toolchain.PULUMI_KUBERNETES_VERSION.lstrip("v")


_PROVIDER = "github.com/pulumi/pulumi-kubernetes/provider/v4"
_PROVIDER_SDK = "github.com/pulumi/pulumi-kubernetes/sdk/v4"
# The executable files of the release tag's provider/ tree: a module zip keeps no file modes,
# and a git tree hash covers them.
_PROVIDER_EXECUTABLES = frozenset(
    [f"pkg/gen/examples/upstream/{n}.md" for n in ("deployment", "ingress", "job")]
    + [f"pkg/gen/examples/upstream/{n}.md" for n in ("pod", "service", "statefulset")]
    + [f"pkg/gen/nodejs-templates/apiextensions/{n}.ts" for n in ("customResource",)]
    + [f"pkg/gen/nodejs-templates/apiextensions/{n}.ts" for n in ("customResourcePatch",)]
)


def git_tree_hash(directory: Path, executables: frozenset[str], skip: frozenset[str]) -> str:
    """The id git gives a tree holding ``directory``'s files (paths relative to it)."""

    def tree(d: Path, rel: str) -> bytes:
        entries = []
        for path in d.iterdir():
            name = rel + path.name
            if name in skip:
                continue
            if path.is_dir():
                entries.append((path.name + "/", b"40000", path.name, tree(path, name + "/")))
            else:
                data = path.read_bytes()
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
                mode = b"100755" if name in executables else b"100644"
                entries.append((path.name, mode, path.name, blob))
        entries.sort(key=lambda e: e[0].encode())
        body = b"".join(m + b" " + n.encode() + b"\0" + sha for _, m, n, sha in entries)
        return hashlib.sha1(b"tree %d\0" % len(body) + body).digest()

    return tree(directory, "").hex()


def test_git_tree_hash_is_gits(tmp_path: Path) -> None:
    """Ids `git write-tree` gives: the empty tree; files a and sub/b, both holding "x\\n"."""
    assert git_tree_hash(tmp_path, frozenset(), frozenset()) == (
        "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    )
    (tmp_path / "a").write_text("x\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_text("x\n")
    assert git_tree_hash(tmp_path, frozenset(), frozenset()) == (
        "d533bf502665ec4d784227c25ef62fe637f1c6d7"
    )
    assert git_tree_hash(tmp_path, frozenset({"sub/b"}), frozenset()) != (
        "d533bf502665ec4d784227c25ef62fe637f1c6d7"
    )


def test_provider_pseudo_version_names_the_release_commit() -> None:
    version = _require("pulumi-kubernetes", _PROVIDER)
    assert version.endswith("-" + toolchain.PULUMI_KUBERNETES_RELEASE_COMMIT[:12])


def test_provider_source_is_the_release_tags_provider_tree() -> None:
    """The module the build compiles is, file for file, provider/ of the release tag.

    (go.sum pins the module zip's content; this ties that content to upstream's tag. The zip
    adds the repository's LICENSE, which provider/ does not hold.)
    """
    src = toolchain._module_dir(TOOLS / "pulumi-kubernetes", _PROVIDER)
    tree = git_tree_hash(src, _PROVIDER_EXECUTABLES, frozenset({"LICENSE"}))
    assert tree == toolchain.PULUMI_KUBERNETES_PROVIDER_TREE


def test_provider_sdk_stand_in_is_the_sdk_release_tag() -> None:
    """The published sdk/v4 module that replaces ``../sdk`` comes from the sdk/ tag of the release.

    (Upstream's sdk/v4.X.Y tag is a commit on top of the release commit that keeps only the Go
    SDK and stamps the version in it: PROVENANCE.md.)
    """
    out = subprocess.run(
        ["go", "mod", "download", "-json", _PROVIDER_SDK],
        cwd=TOOLS / "pulumi-kubernetes",
        env=toolchain.go_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    info = json.loads(Path(json.loads(out)["Info"]).read_text())
    assert info["Version"] == toolchain.PULUMI_KUBERNETES_VERSION
    assert info["Origin"]["Ref"] == f"refs/tags/sdk/{toolchain.PULUMI_KUBERNETES_VERSION}"
    assert info["Origin"]["URL"] == "https://github.com/pulumi/pulumi-kubernetes"


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


def test_node_binaries_use_the_control_planes_kubernetes_and_containerd_is_pinned() -> None:
    assert _require("kubelet", "k8s.io/kubernetes") == toolchain.KUBERNETES_VERSION
    staging = toolchain.KUBERNETES_VERSION.replace("v1.", "v0.")
    replaced = re.findall(r"=> \S+ (v\S+)", (TOOLS / "kubelet" / "go.mod").read_text())
    assert replaced and set(replaced) == {staging}
    assert toolchain.GROUPS["kubelet"].ldflags == toolchain.GROUPS["kubernetes"].ldflags
    assert (
        _require("containerd", "github.com/containerd/containerd/v2")
        == toolchain.CONTAINERD_VERSION
    )


def test_per_binary_tags_are_part_of_the_key_only_when_set(tmp_path: Path, monkeypatch) -> None:
    """Groups without ``binary_tags`` keep the key (and cache entry) they had before it."""
    group_dir = tmp_path / "demo"
    group_dir.mkdir()
    (group_dir / "go.mod").write_text("module x\n")
    monkeypatch.setattr(toolchain, "TOOLS_DIR", tmp_path)
    plain = toolchain.Group("demo", {"x": "."})
    h = hashlib.sha256()
    h.update(b"go.mod")
    h.update(b"module x\n")
    h.update(json.dumps([{"x": "."}, [], "", toolchain._RECIPE_REVISION]).encode())
    h.update(toolchain._go_version().encode())
    assert plain.key() == h.hexdigest()[:16]
    assert toolchain.Group("demo", {"x": "."}, binary_tags={"x": "no_grpc"}).key() != plain.key()


def test_pause_image_archive_is_one_layer_holding_the_binary(tmp_path: Path) -> None:
    (tmp_path / "pause").write_bytes(b"\x7fELF fake")
    toolchain._write_pause_image(tmp_path, tmp_path)
    archive = tmp_path / toolchain.PAUSE_IMAGE_ARCHIVE
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    index = json.loads(files["index.json"])
    (desc,) = index["manifests"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == toolchain.PAUSE_IMAGE_TAG

    def blob(d: dict) -> bytes:
        data = files[f"blobs/sha256/{d['digest'].split(':')[1]}"]
        assert hashlib.sha256(data).hexdigest() == d["digest"].split(":")[1]
        assert len(data) == d["size"]
        return data

    manifest = json.loads(blob(desc))
    config = json.loads(blob(manifest["config"]))
    (layer_desc,) = manifest["layers"]
    layer = blob(layer_desc)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        (member,) = tar.getmembers()
        assert member.name == "pause" and member.mode == 0o755
        assert tar.extractfile(member).read() == b"\x7fELF fake"
    # Reproducible: the same binary gives the same archive.
    first = archive.read_bytes()
    toolchain._write_pause_image(tmp_path, tmp_path)
    assert archive.read_bytes() == first


def test_yaml_language_host_is_pinned_with_its_own_pulumi_versions() -> None:
    # The release named by toolchain.PULUMI_YAML_VERSION, built with the pulumi/pulumi versions
    # of its own go.mod (it does not compile against the CLI's pkg/v3: PROVENANCE.md there).
    group = toolchain.GROUPS["pulumi-yaml"]
    assert _require("pulumi-yaml", "github.com/pulumi/pulumi-yaml") == toolchain.PULUMI_YAML_VERSION
    assert group.packages == {"pulumi-language-yaml": "."}
    # The wrapper's main serves the released host (pkg/server), adding only Link.
    main = (TOOLS / "pulumi-yaml" / "main.go").read_text()
    assert '"github.com/pulumi/pulumi-yaml/pkg/server"' in main
    assert "server.NewLanguageHost(" in main
    assert group.ldflags == [
        "-X github.com/pulumi/pulumi-yaml/pkg/version.Version=" + toolchain.PULUMI_YAML_VERSION
    ]
    upstream = _require("pulumi-yaml", "github.com/pulumi/pulumi/pkg/v3")
    assert _require("pulumi-yaml", "github.com/pulumi/pulumi/sdk/v3") == upstream
    assert _release(upstream) < _release(toolchain.PULUMI_VERSION)
    # No replace lines: the module as pulumi-yaml itself builds it.
    assert "replace" not in (TOOLS / "pulumi-yaml" / "go.mod").read_text().split("module ")[1]
    sums = (TOOLS / "pulumi-yaml" / "go.sum").read_text()
    assert f"github.com/pulumi/pulumi-yaml {toolchain.PULUMI_YAML_VERSION} h1:" in sums


def test_the_yaml_host_is_on_the_clis_path_once_built(monkeypatch, tmp_path: Path) -> None:
    from tools import localenv

    monkeypatch.setenv("PMEM_CSI_TOOLS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(tmp_path / "state"))
    yaml_bin = toolchain.GROUPS["pulumi-yaml"].install_dir() / "bin"
    assert str(yaml_bin) not in localenv.pulumi_env()["PATH"].split(":")
    yaml_bin.mkdir(parents=True)
    (yaml_bin.parent / ".complete").write_text("1\n")
    assert str(yaml_bin) in localenv.pulumi_env()["PATH"].split(":")
    assert toolchain.bin_path("pulumi-language-yaml") == yaml_bin / "pulumi-language-yaml"
