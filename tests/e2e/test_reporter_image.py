"""The reporter image, built by ``tools.image``: what it holds, and that its build is reproducible.

The image is built once (cached by its inputs, as ``make image`` does). It runs as the
program's reporter Deployment under a real kubelet in tests/e2e/test_real_node.py, which
replaced the runc harness that imitated a kubelet here (``oci_pod.py``): every check that
harness made (arguments, user, read-only root, capabilities, seccomp, memory limit,
in-cluster credentials, Lease take-over, SIGTERM) is made there on the kubelet's pods.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pmem_components.manifests import bundle
from tests.e2e.reporter_helpers import driver_config
from tools import image as image_tool

IN_CI = any(
    os.environ.get(var, "").lower() in {"1", "true", "yes"}
    for var in ("CI", "PMEM_CSI_REQUIRE_CLUSTER")
)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def built() -> image_tool.BuiltImage:
    """The image as ``make image`` builds it (from the cache when its inputs are unchanged)."""
    if os.geteuid() != 0:
        _unavailable("building the image needs root (mmdebstrap, chroot)")
    try:
        return image_tool.build()
    except image_tool.ImageError as err:
        pytest.fail(f"image build failed: {err}")


@pytest.fixture(scope="module")
def rootfs(built: image_tool.BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's root filesystem, unpacked with umoci."""
    bundle_dir = tmp_path_factory.mktemp("bundle") / "unpacked"
    subprocess.run(
        ["umoci", "unpack", "--image", built.ref, str(bundle_dir)], check=True, capture_output=True
    )
    return bundle_dir / "rootfs"


@pytest.fixture(scope="module")
def img_config(built: image_tool.BuiltImage) -> dict[str, Any]:
    """The ``config`` object of the image (Entrypoint, Env, User...)."""

    def blob(digest: str) -> dict[str, Any]:
        algo, hexd = digest.split(":", 1)
        return json.loads((built.layout / "blobs" / algo / hexd).read_text(encoding="utf-8"))

    (desc,) = json.loads((built.layout / "index.json").read_text(encoding="utf-8"))["manifests"]
    return dict(blob(blob(desc["digest"])["config"]["digest"]).get("config") or {})


# --------------------------------------------------------------------------- the image


def test_the_image_holds_the_reporter_and_its_pinned_packages_only(
    built: image_tool.BuiltImage, rootfs: Path, img_config: dict[str, Any]
) -> None:
    cfg = driver_config("img.pmem-csi.intel.com", "img", f"localhost/x@{built.digest}")
    (dep,) = [o for o in bundle.reporter_objects(cfg) if o["kind"] == "Deployment"]
    run_as = dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    # A non-root user matching the pod's runAsUser, known to the image's passwd.
    assert img_config["User"] == f"{run_as}:{run_as}"
    passwd = (rootfs / "etc/passwd").read_text().splitlines()
    assert (
        f"reporter:x:{run_as}:{run_as}:pmem-csi reporter:/nonexistent:/usr/sbin/nologin" in passwd
    )
    # The reporter and the pmem_components modules it imports; no Pulumi SDK, no config model.
    site = rootfs / image_tool.SITE_PACKAGES
    assert (site / "reporter/__main__.py").is_file()
    assert (site / "pmem_components/certs.py").is_file()
    assert not (site / "pmem_components/config.py").exists()
    assert not list(site.glob("pulumi*"))
    assert not (site / "kubernetes/aio").exists() and not list(site.glob("aiohttp*"))
    # No compiler, no package installer, no shell.
    for tool in ("gcc", "cc", "c++", "ld", "as", "pip", "pip3", "sh", "bash"):
        for bindir in ("usr/bin", "bin", "usr/local/bin"):
            assert not (rootfs / bindir / tool).exists(), f"/{bindir}/{tool} in the image"
    # Exactly the pinned Debian packages, recorded for image scanners.
    status = (rootfs / "var/lib/dpkg/status").read_text()
    installed = dict(
        (block.split("\n")[0].removeprefix("Package: "), _field(block, "Version"))
        for block in status.strip().split("\n\n")
    )
    assert installed == image_tool.read_packages_lock()
    # The archive skopeo pushes is the same image as the layout.
    out = subprocess.run(
        ["skopeo", "inspect", f"oci-archive:{built.archive}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(out)["Digest"] == built.digest


def _field(block: str, name: str) -> str:
    for line in block.splitlines():
        if line.startswith(f"{name}: "):
            return line.split(": ", 1)[1]
    return ""


def test_two_builds_from_the_same_inputs_give_the_same_digest(
    built: image_tool.BuiltImage, tmp_path: Path
) -> None:
    """A second build from scratch (fresh mmdebstrap, pip, tar, umoci), as a clean clone does.

    It runs from a copy of the checkout at another path, with the virtualenv reached through
    another path too: CI builds in a fresh clone, and a host path that leaks into the image
    (an interpreter line, a RECORD hash) changes the digest only there.
    """
    checkout = tmp_path / "clone"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=image_tool.PROJECT_DIR, check=True, capture_output=True
    ).stdout.decode().split("\0")
    for rel in filter(None, tracked):
        src = image_tool.PROJECT_DIR / rel
        if src.is_file():
            (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, checkout / rel)
    venv = tmp_path / "venv"
    venv.symlink_to(Path(sys.prefix))
    cache = tmp_path / "cache"
    cache.mkdir()
    # Wheels are downloaded by hash into the shared cache; no need to fetch them twice.
    (cache / "wheels").symlink_to(image_tool.cache_root() / "wheels")
    subprocess.run(
        [venv / "bin/python", "-m", "tools.image", "build", "--force"],
        cwd=checkout,
        env={**os.environ, "PMEM_CSI_IMAGE_CACHE": str(cache)},
        check=True,
    )
    again = image_tool.BuiltImage(cache / built.dir.name)
    assert again.digest == built.digest
    assert again.archive.read_bytes() == built.archive.read_bytes()
