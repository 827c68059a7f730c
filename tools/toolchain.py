"""Build and locate the pinned Go tools the local cluster and the Pulumi engine need.

The machines this project runs on have no Kubernetes and no Pulumi CLI, and can reach only
package registries (the Go module proxy among them). Each tool group is a wrapper Go module
under ``tools/<group>/`` (go.mod + go.sum checked in), built with ``go build`` into a cache
directory keyed by a hash of that module and the build flags. A pin change therefore makes a
new cache entry; an unchanged pin is never rebuilt.

Usage: ``python -m tools.toolchain build [GROUP...]`` and ``python -m tools.toolchain path``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
PROJECT_DIR = TOOLS_DIR.parent

# Versions stamped into the binaries. They must agree with the wrapper modules' go.mod files
# (tests/unit/test_toolchain.py checks that).
KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.8.0"
PULUMI_VERSION = "v3.276.0"
# The Python SDK (`pulumi` in requirements.txt) is not the CLI's version: what an administrator
# gets today is the newest CLI with the newest SDK on PyPI, and the module proxy serves no CLI
# 3.261-3.272 (tools/pulumi/PROVENANCE.md). A CLI runs older SDKs, not newer ones, so the SDK
# may lag the CLI but never lead it (tests/unit/test_toolchain.py).
PULUMI_PYTHON_SDK_VERSION = "3.272.0"
PULUMI_KUBERNETES_VERSION = "v4.25.0"
# The YAML language host (github.com/pulumi/pulumi-yaml). The CLI 3.276.0 bundles a newer
# release, but the module proxy serves only v1.11.1 and v1.25.0; built with the pulumi/pulumi
# versions of its own go.mod (v3.206.0), since it does not compile against pkg/v3 v3.276.0
# (tools/pulumi-yaml/PROVENANCE.md).
PULUMI_YAML_VERSION = "v1.25.0"
# The release that PULUMI_KUBERNETES_VERSION names, as upstream tagged it: tag v4.25.0 of
# pulumi/pulumi-kubernetes is this commit, and the git tree of its provider/ directory is this
# tree. The module proxy serves that directory only as the pseudo-version in
# tools/pulumi-kubernetes/go.mod (no other provider commit: tools/pulumi-kubernetes/PROVENANCE.md);
# tests/unit/test_toolchain.py recomputes the tree from the module the build compiles.
PULUMI_KUBERNETES_RELEASE_COMMIT = "f47bc2d6f1996444d11c12b4ef083b82585f7c07"
PULUMI_KUBERNETES_PROVIDER_TREE = "b4c8d5e1f1f531df6bbed93b49f53ef79851ffc6"
CONTAINERD_VERSION = "v2.4.2"

# Bumped when this file changes how a group is built, so old cache entries are not reused.
_RECIPE_REVISION = "1"


def cache_root() -> Path:
    """Where built tools live, outside the work tree so a fresh clone reuses them."""
    env = os.environ.get("PMEM_CSI_TOOLS_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "pmem-csi-pulumi" / "tools"


def _version_ldflags(pkg: str, version: str) -> list[str]:
    major, minor = version.lstrip("v").split(".")[:2]
    return [
        f"-X {pkg}.gitVersion={version}",
        f"-X {pkg}.gitMajor={major}",
        f"-X {pkg}.gitMinor={minor}",
        f"-X {pkg}.gitTreeState=clean",
    ]


def _module_dir(group_dir: Path, module: str) -> Path:
    """Source directory of a module at the version the wrapper requires, downloading it.

    (``go list -m`` alone prints an empty directory for a module not yet in the module cache,
    which is the case on a fresh machine before the first build.)
    """
    out = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=group_dir,
        env=go_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    directory = json.loads(out).get("Dir")
    if not directory:
        raise RuntimeError(f"go mod download gave no directory for {module}: {out}")
    return Path(directory)


def _prepare_provider(group_dir: Path) -> None:
    """Write the schema and mapping files that upstream's `go generate` would embed."""
    src = _module_dir(group_dir, "github.com/pulumi/pulumi-kubernetes/provider/v4")
    cmd_dir = src / "cmd" / "pulumi-resource-kubernetes"
    schema = json.loads((cmd_dir / "schema.json").read_text())
    schema["version"] = PULUMI_KUBERNETES_VERSION.lstrip("v")
    (group_dir / "schema-embed.json").write_text(json.dumps(schema))
    mapping = json.loads((cmd_dir / "terraform-mapping.json").read_text())
    (group_dir / "terraform-mapping-embed.json").write_text(json.dumps(mapping))


def _install_python_shims(group_dir: Path, bin_dir: Path) -> None:
    """Put the Pulumi Python SDK's helper scripts next to the CLI.

    `pulumi-resource-pulumi-python` runs Python dynamic providers (used for the generated
    certificates); it ships in the sdk module, not in the CLI build.
    """
    sdk = _module_dir(group_dir, "github.com/pulumi/pulumi/sdk/v3")
    for name in ("pulumi-resource-pulumi-python",):
        target = bin_dir / name
        shutil.copyfile(sdk / "python" / "dist" / name, target)
        target.chmod(0o755)


# The stand-in language host (tools/langhost.py), installed next to the CLI under the names
# the CLI and the official plugin use. Python files, not part of any group's build or hash:
# installed (idempotently) on every `build`, also when the pulumi group is already cached.
LANGUAGE_HOST_FILES = {
    "pulumi-language-python": TOOLS_DIR / "langhost.sh",
    "pulumi-language-python-host": TOOLS_DIR / "langhost.py",
    "pulumi-language-python-exec": TOOLS_DIR / "langhost_exec.py",
}


# Names the directory the launcher next to the CLI runs the host from (set by
# localenv.pulumi_env to one in the checkout's state directory): the tools cache is shared by
# checkouts, and the copy next to the CLI is whichever checkout installed last.
LANGUAGE_HOST_DIR_ENV = "PMEM_CSI_LANGUAGE_HOST_DIR"


def install_language_host(bin_dir: Path) -> None:
    """Copy the stand-in `pulumi-language-python` next to the CLI when missing or outdated.

    The cache is shared by checkouts, so each file is replaced atomically (write + rename):
    a CLI starting the plugin at that moment sees the old or the new file, never half of one.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, source in LANGUAGE_HOST_FILES.items():
        target = bin_dir / name
        content = source.read_bytes()
        if target.exists() and target.read_bytes() == content and os.access(target, os.X_OK):
            continue
        tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_bytes(content)
        tmp.chmod(0o755)
        tmp.replace(target)


@dataclass(frozen=True)
class Group:
    """One wrapper module and the commands built from it."""

    name: str
    packages: dict[str, str]  # output binary name -> Go package
    ldflags: list[str] = field(default_factory=list)
    tags: str = ""
    prepare: Callable[[Path], None] | None = None
    finish: Callable[[Path, Path], None] | None = None
    # Runs after every build() call, cached or not; not part of key() (see LANGUAGE_HOST_FILES).
    install: Callable[[Path], None] | None = None
    # Tags added to ``tags`` for single binaries (containerd's shim wants ``no_grpc``).
    binary_tags: dict[str, str] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return TOOLS_DIR / self.name

    def key(self) -> str:
        """Hash of everything that determines the binaries."""
        h = hashlib.sha256()
        for path in sorted(self.dir.glob("*")):
            if path.suffix in {".mod", ".sum", ".go"}:
                h.update(path.name.encode())
                h.update(path.read_bytes())
        recipe: list[object] = [self.packages, self.ldflags, self.tags, _RECIPE_REVISION]
        if self.binary_tags:  # only when set, so the older groups keep their cache entries
            recipe.append(self.binary_tags)
        h.update(json.dumps(recipe).encode())
        h.update(_go_version().encode())
        return h.hexdigest()[:16]

    def install_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.key()}"

    def is_built(self) -> bool:
        return (self.install_dir() / ".complete").exists()


# The pod sandbox image of the real node (tools/realnode.py): the pause binary alone, as an OCI
# archive next to it in the pause group's bin directory, imported into the node's containerd.
PAUSE_IMAGE_ARCHIVE = "pause.oci.tar"
PAUSE_IMAGE_TAG = "latest"
# Fixed timestamp, so the archive (and its digest) depends only on the binary.
_PAUSE_EPOCH = 1767225600


def _blob(layout: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _tar_add(layout, f"blobs/sha256/{digest.split(':')[1]}", data, 0o644)
    return {"digest": digest, "size": len(data)}


def _tar_add(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, _PAUSE_EPOCH
    archive.addfile(info, io.BytesIO(data))


def _write_pause_image(group_dir: Path, bin_dir: Path) -> None:
    """Wrap the pause binary in a one-layer OCI image archive (no registry is reachable here)."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.USTAR_FORMAT) as layer:
        _tar_add(layer, "pause", (bin_dir / "pause").read_bytes(), 0o755)
    layer_bytes = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as layout:
        layer_desc = _blob(layout, layer_bytes)
        config_desc = _blob(layout, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
        }
        manifest_desc = _blob(layout, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE_TAG},
                }
            ],
        }
        _tar_add(layout, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644)
        _tar_add(layout, "index.json", json.dumps(index, sort_keys=True).encode(), 0o644)
    (bin_dir / PAUSE_IMAGE_ARCHIVE).write_bytes(out.getvalue())


_K8S = "k8s.io/kubernetes/cmd"
_K8S_VERSION_LDFLAGS = _version_ldflags(
    "k8s.io/component-base/version", KUBERNETES_VERSION
) + _version_ldflags("k8s.io/client-go/pkg/version", KUBERNETES_VERSION)
_CONTAINERD = "github.com/containerd/containerd/v2"
GROUPS: dict[str, Group] = {
    g.name: g
    for g in [
        Group(
            "kubernetes",
            {
                "kube-apiserver": f"{_K8S}/kube-apiserver",
                "kube-controller-manager": f"{_K8S}/kube-controller-manager",
                "kube-scheduler": f"{_K8S}/kube-scheduler",
                "kubectl": f"{_K8S}/kubectl",
            },
            ldflags=_K8S_VERSION_LDFLAGS,
        ),
        Group("etcd", {"etcd": "go.etcd.io/etcd/server/v3"}),
        Group(
            "kwok",
            {"kwok": "sigs.k8s.io/kwok/cmd/kwok", "kwokctl": "sigs.k8s.io/kwok/cmd/kwokctl"},
        ),
        Group(
            "pulumi",
            {"pulumi": "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"},
            ldflags=[
                "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=" + PULUMI_VERSION
            ],
            tags="osusergo,grpcnotrace",
            finish=_install_python_shims,
            install=install_language_host,
        ),
        # Runs YAML programs (tests/e2e/test_yaml_package.py: the component provider used from
        # YAML). A group of its own: other pulumi/pulumi versions than the CLI's.
        Group(
            "pulumi-yaml",
            # tools/pulumi-yaml/main.go: the release's host plus the Link that the CLI's
            # `pulumi package add` needs and later releases answer.
            {"pulumi-language-yaml": "."},
            ldflags=["-X github.com/pulumi/pulumi-yaml/pkg/version.Version=" + PULUMI_YAML_VERSION],
            tags="osusergo,grpcnotrace",
        ),
        # The code generator of the stand-in Node.js language host (tools/langhost_nodejs.py,
        # tests/e2e/test_typescript_package.py): the CLI's own module and version, so its
        # TypeScript SDKs are the CLI's (tools/pulumi-nodejs/main.go).
        Group(
            "pulumi-nodejs",
            {"pulumi-nodejs-codegen": "."},
            tags="osusergo,grpcnotrace",
        ),
        Group(
            "pulumi-kubernetes",
            {"pulumi-resource-kubernetes": "."},
            ldflags=[
                "-X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version="
                + PULUMI_KUBERNETES_VERSION
            ],
            prepare=_prepare_provider,
        ),
        # The one real node beside the kwok nodes (tools/realnode.py). Own wrapper modules, so
        # adding them left the control plane's cache key (tools/kubernetes) unchanged.
        Group(
            "kubelet",
            {"kubelet": f"{_K8S}/kubelet", "kube-proxy": f"{_K8S}/kube-proxy"},
            ldflags=_K8S_VERSION_LDFLAGS,
        ),
        Group(
            "containerd",
            {
                "containerd": f"{_CONTAINERD}/cmd/containerd",
                "ctr": f"{_CONTAINERD}/cmd/ctr",
                "containerd-shim-runc-v2": f"{_CONTAINERD}/cmd/containerd-shim-runc-v2",
            },
            ldflags=[f"-X {_CONTAINERD}/version.Version={CONTAINERD_VERSION}"],
            tags="urfave_cli_no_docs,osusergo,netgo,static_build,no_btrfs",
            binary_tags={"containerd-shim-runc-v2": "no_grpc"},
        ),
        Group("pause", {"pause": "."}, finish=_write_pause_image),
    ]
}


def go_env() -> dict[str, str]:
    """Environment for the go command: the machine's own Go, static binaries."""
    env = dict(os.environ)
    env.update({"GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"})
    return env


_GO_VERSION: str | None = None


def _go_version() -> str:
    global _GO_VERSION
    if _GO_VERSION is None:
        if shutil.which("go") is None:
            raise RuntimeError("the 'go' command is missing; this machine kind provides Go")
        _GO_VERSION = subprocess.run(
            ["go", "env", "GOVERSION"], env=go_env(), capture_output=True, text=True, check=True
        ).stdout.strip()
    return _GO_VERSION


def _log(msg: str) -> None:
    print(f"[tools] {msg}", file=sys.stderr, flush=True)


def build(group: Group) -> Path:
    """Build one group unless cached, then run its ``install`` step; return its bin directory."""
    bin_dir = _build_cached(group)
    if group.install:
        group.install(bin_dir)
    return bin_dir


def _build_cached(group: Group) -> Path:
    """Build one group into the cache unless it is there; return its bin directory.

    Several checkouts (worktrees, a CI clone next to a developer's tree) share the cache, so
    a build holds a per-group file lock: a second caller waits and then finds the result.
    """
    final = group.install_dir()
    if group.is_built():
        return final / "bin"
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another process that builds {group.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if group.is_built():
            return final / "bin"
        return _build_locked(group, final)


def _build_locked(group: Group, final: Path) -> Path:
    names = ", ".join(group.packages)
    _log(f"building {group.name} ({names}) into {final}")
    start = time.monotonic()
    staging = final.with_name(final.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    if group.prepare:
        group.prepare(group.dir)
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(30):
            _log(f"  still building {group.name}: {time.monotonic() - start:.0f}s elapsed")

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        for binary, pkg in group.packages.items():
            cmd = ["go", "build", "-trimpath", "-o", str(staging / "bin" / binary)]
            if group.ldflags:
                cmd += ["-ldflags", " ".join(["-s", "-w", *group.ldflags])]
            else:
                cmd += ["-ldflags", "-s -w"]
            tags = ",".join(t for t in (group.tags, group.binary_tags.get(binary, "")) if t)
            if tags:
                cmd += ["-tags", tags]
            cmd.append(pkg)
            t0 = time.monotonic()
            subprocess.run(cmd, cwd=group.dir, env=go_env(), check=True)
            _log(f"  {binary} built in {time.monotonic() - t0:.0f}s")
        if group.finish:
            group.finish(group.dir, staging / "bin")
    finally:
        stop.set()
    (staging / ".complete").write_text(f"{time.monotonic() - start:.0f}\n")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    _log(f"{group.name} done in {time.monotonic() - start:.0f}s")
    return final / "bin"


def build_all(names: list[str] | None = None) -> dict[str, Path]:
    return {name: build(GROUPS[name]) for name in names or list(GROUPS)}


def bin_path(binary: str) -> Path:
    """Absolute path of a built binary; raises with a clear message if it is not built."""
    for group in GROUPS.values():
        if (
            binary in group.packages
            or (
                group.name == "pulumi"
                and (binary == "pulumi-resource-pulumi-python" or binary in LANGUAGE_HOST_FILES)
            )
            or (group.name == "pause" and binary == PAUSE_IMAGE_ARCHIVE)
        ):
            path = group.install_dir() / "bin" / binary
            if not group.is_built():
                raise FileNotFoundError(
                    f"{binary} is not built (group '{group.name}'); run "
                    f"'python -m tools.toolchain build {group.name}' or 'make tools'"
                )
            return path
    raise KeyError(f"unknown tool {binary!r}")


def missing() -> list[str]:
    """Groups that still need building."""
    return [name for name, g in GROUPS.items() if not g.is_built()]


def path_dirs() -> list[Path]:
    """The bin directories of every built group, for PATH."""
    return [g.install_dir() / "bin" for g in GROUPS.values() if g.is_built()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.toolchain", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build missing tool groups")
    b.add_argument("groups", nargs="*", metavar="GROUP", help=f"one of {', '.join(GROUPS)}")
    sub.add_parser("status", help="show which groups are built and where")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        unknown = sorted(set(args.groups) - set(GROUPS))
        if unknown:
            parser.error(f"unknown tool group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
        t0 = time.monotonic()
        build_all(args.groups or None)
        _log(f"all requested tools ready ({time.monotonic() - t0:.0f}s)")
    else:
        for name, group in GROUPS.items():
            state = "built" if group.is_built() else "missing"
            print(f"{name:18} {state:8} {group.install_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
