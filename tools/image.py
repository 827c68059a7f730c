"""Build the status reporter's container image: no daemon, no registry, the same bytes twice.

Why this way: the machines this project runs on have no Docker engine and no registry, only
Debian's packages and PyPI. ``mmdebstrap`` extracts a minimal Debian root filesystem (the
Python interpreter and the libraries it links, nothing that runs maintainer scripts: no
shell is needed at run time), the pinned wheels are installed into it with pip from outside,
the reporter's sources are copied in, and ``umoci`` wraps the result into an OCI image layout,
which is also written as an ``oci-archive`` tarball that ``skopeo`` copies to any registry.

Reproducible: the Debian packages are pinned by version in ``reporter/image-packages.lock``
(no Debian snapshot archive is reachable from these machines, so a dated snapshot cannot be
used), the wheels by version and sha256 in ``reporter/requirements-image.txt`` (the full
dependency closure of ``reporter/requirements.txt`` for CPython 3.11 on manylinux x86_64),
every timestamp is ``SOURCE_DATE_EPOCH``, tar entries are sorted with numeric root ownership,
and byte code is compiled with hash-based invalidation (no mtimes inside). Two builds from the
same inputs therefore give the same manifest digest; ``tests/e2e/test_reporter_image.py``
checks that the cached image matches a fresh build's digest when asked to
(``PMEM_CSI_IMAGE_REBUILD=1``), and BENCHMARKS.md records it.

Cached by inputs: the build is keyed by a hash of this file, both lock files,
``reporter/requirements.txt`` and every source file copied into the image; an unchanged key is
never rebuilt. The result lives in ``~/.cache/pmem-csi-pulumi/image/reporter-<key>/``
(``oci/`` layout, ``reporter.oci.tar`` archive, ``digest``).

Usage::

    python -m tools.image build       # build unless cached; print the layout, archive, digest
    python -m tools.image lock        # re-resolve the pins (after a Debian point release or
                                      # a requirements change), then commit both lock files
    python -m tools.image path        # print the cache entry without building

Root is required (mmdebstrap's root mode and chroot for byte-compiling); the host packages
``mmdebstrap umoci skopeo runc`` are installed with apt-get when missing.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import hostpkg

TOOLS_DIR = Path(__file__).resolve().parent
PROJECT_DIR = TOOLS_DIR.parent
REPORTER_DIR = PROJECT_DIR / "reporter"
PACKAGES_LOCK = REPORTER_DIR / "image-packages.lock"
WHEELS_LOCK = REPORTER_DIR / "requirements-image.txt"
REQUIREMENTS = REPORTER_DIR / "requirements.txt"

# The Debian release and where its packages come from (bookworm ships Python 3.11, the
# version this project is tested with).
SUITE = "bookworm"
ARCH = "amd64"


def host_mirrors(sources_dir: Path = Path("/etc/apt")) -> list[str]:
    """The host's own apt sources for this suite, as one-line ``deb URI SUITE COMPONENTS``.

    Why not a fixed mirror: the packages must come from wherever this machine's apt is set up
    to fetch them (a site mirror or proxy on an administrator's machine), and that is already
    configured and trusted there. Both the one-line ``sources.list`` format and deb822
    ``*.sources`` files are read; suites of other releases are ignored.
    """
    entries: list[str] = []
    files = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split():
                    continue
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        entries.append(f"deb {uri} {suite} {fields.get('components', 'main')}")
        elif path.name == "sources.list" or path.suffix == ".list":
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if len(words) >= 3 and words[0] == "deb":
                    words = [w for w in words if not w.startswith("[")]
                    entries.append(" ".join(words))
    mine = [e for e in entries if e.split()[2].split("-")[0] == SUITE]
    if not mine:
        raise ImageError(
            f"no apt source for Debian {SUITE} in {sources_dir}/sources.list(.d); the image is "
            f"built from the host's configured Debian mirror"
        )
    return mine
# The root of the dependency closure: the interpreter with its standard library.
ROOT_PACKAGES = ("python3.11",)
PYTHON = "/usr/bin/python3.11"
PYTHON_VERSION = "3.11"
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
# Wheel tags pip may choose for the image: CPython 3.11, manylinux up to bookworm's glibc 2.36.
WHEEL_ABIS = ("cp311", "abi3", "none")
WHEEL_PLATFORMS = (
    *(f"manylinux_2_{v}_x86_64" for v in range(36, 16, -1)),
    "manylinux2014_x86_64",
)
# Fixed time of every file, the image config and its history (2026-01-01T00:00:00Z), unless
# SOURCE_DATE_EPOCH says otherwise (then the digest changes with it, as it should).
DEFAULT_EPOCH = 1767225600
TAG = "latest"
# Cache entries kept (the newest); older ones are removed after a build.
KEEP_ENTRIES = 3
IMAGE_TITLE = "pmem-csi-reporter"
METRICS_PORT = 8080
# What the reporter does not need at run time; removed to keep the image small.
PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
)
# Installed by ``kubernetes`` for its asyncio client (``kubernetes.aio``), which the reporter
# never imports (it uses the synchronous client; the runc test runs the image without them):
# leaving them out saves about 75 MiB. Only ``kubernetes.aio`` and these import aiohttp.
UNUSED_DISTRIBUTIONS = frozenset(
    {"aiohttp", "aiohttp-retry", "aiohappyeyeballs", "aiosignal", "attrs", "frozenlist",
     "multidict", "propcache", "yarl"}
)  # fmt: skip
UNUSED_PATHS = ("kubernetes/aio",)
# Host packages the build and the runc test need (Debian names).
HOST_PACKAGES = {"mmdebstrap": "mmdebstrap", "umoci": "umoci", "skopeo": "skopeo", "runc": "runc"}

# Bumped when this file changes the build in a way the hash of its text would not show.
_RECIPE_REVISION = "1"


class ImageError(RuntimeError):
    """The image cannot be built; the message says why and what to do."""


def _log(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """Next to the Go tools' cache, so a fresh clone reuses a built image."""
    env = os.environ.get("PMEM_CSI_IMAGE_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "pmem-csi-pulumi" / "image"


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


def reporter_uid() -> int:
    """The pod's ``runAsUser``, from the Deployment builder: the image's user must match it."""
    from pmem_components.manifests.reporter import REPORTER_UID

    return REPORTER_UID


# --------------------------------------------------------------------------- inputs


def _first_party_imports(path: Path, lazy: bool) -> set[str]:
    """Modules of ``pmem_components`` and ``reporter`` that ``path`` imports.

    ``lazy`` also follows imports inside functions; without it only module-level imports
    count (``pmem_components/__init__.py`` imports its Pulumi components lazily precisely so
    that the reporter does not need them).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes: list[ast.AST] = list(ast.walk(tree)) if lazy else []
    if not lazy:
        todo: list[ast.AST] = list(tree.body)
        while todo:
            node = todo.pop()
            nodes.append(node)
            if isinstance(node, ast.If | ast.Try):
                todo.extend(ast.iter_child_nodes(node))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in ("pmem_components", "reporter")}


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    as_module = PROJECT_DIR.joinpath(*parts).with_suffix(".py")
    if as_module.is_file():
        return as_module
    as_package = PROJECT_DIR.joinpath(*parts, "__init__.py")
    return as_package if as_package.is_file() else None


def reporter_sources() -> list[Path]:
    """Every first-party file the reporter imports, relative to the project.

    All of ``reporter/*.py`` plus the ``pmem_components`` modules they import, transitively
    (with each package's ``__init__``; see ``_first_party_imports`` for lazy imports): the
    image carries no config model, manifest builder or Pulumi component, because the reporter
    never imports them. The runc test proves the list is enough.
    """
    todo = sorted(REPORTER_DIR.glob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        rel = path.relative_to(PROJECT_DIR)
        for i in range(1, len(rel.parts)):
            init = PROJECT_DIR.joinpath(*rel.parts[:i], "__init__.py")
            if init.is_file():
                todo.append(init)
        lazy = rel.parts[0] == "reporter"
        for module in _first_party_imports(path, lazy):
            found = _module_file(module)
            if found is not None:
                todo.append(found)
    return sorted(p.relative_to(PROJECT_DIR) for p in seen)


def input_files() -> list[Path]:
    """What the image is built from: the cache key covers exactly these files."""
    return [
        Path(__file__).resolve().relative_to(PROJECT_DIR),
        PACKAGES_LOCK.relative_to(PROJECT_DIR),
        WHEELS_LOCK.relative_to(PROJECT_DIR),
        REQUIREMENTS.relative_to(PROJECT_DIR),
        *reporter_sources(),
    ]


def cache_key() -> str:
    h = hashlib.sha256()
    h.update(f"revision={_RECIPE_REVISION} epoch={source_date_epoch()}\n".encode())
    for rel in input_files():
        h.update(f"{rel}\n".encode())
        h.update(hashlib.sha256((PROJECT_DIR / rel).read_bytes()).hexdigest().encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class BuiltImage:
    """One cache entry: an OCI layout, the same image as an oci-archive, and its digest."""

    dir: Path

    @property
    def layout(self) -> Path:
        return self.dir / "oci"

    @property
    def archive(self) -> Path:
        return self.dir / "reporter.oci.tar"

    @property
    def ref(self) -> str:
        """``umoci``/``skopeo`` reference of the layout (``oci:<ref>`` for skopeo)."""
        return f"{self.layout}:{TAG}"

    @property
    def digest(self) -> str:
        return (self.dir / "digest").read_text(encoding="utf-8").strip()

    def exists(self) -> bool:
        return (self.dir / "digest").is_file()


def entry(key: str | None = None) -> BuiltImage:
    return BuiltImage(cache_root() / f"reporter-{key or cache_key()}")


# --------------------------------------------------------------------------- host tools


def ensure_host_tools(names: Sequence[str] = tuple(HOST_PACKAGES)) -> None:
    """Install the Debian packages of missing host tools with apt-get, only when missing."""
    try:
        hostpkg.ensure({n: HOST_PACKAGES[n] for n in names})
    except hostpkg.HostPackageError as err:
        raise ImageError(str(err)) from err


# --------------------------------------------------------------------------- helpers


def _run(cmd: Sequence[str | Path], log: Path, **kw: object) -> None:
    """Run a build step, its output appended to ``log``; on failure show the log's tail."""
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=out, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
        raise ImageError(f"{Path(str(cmd[0])).name} failed ({proc.returncode}); log {log}:\n{tail}")


def _pip_env() -> dict[str, str]:
    """pip without the machine's local wheel directory: the lock's hashes name PyPI's files."""
    return {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_NO_INDEX")}


def _wheel_tag_args() -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION]
    for abi in WHEEL_ABIS:
        args += ["--abi", abi]
    for platform in WHEEL_PLATFORMS:
        args += ["--platform", platform]
    return args


def _deb_fields(deb: Path) -> dict[str, str]:
    out = subprocess.run(
        ["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True
    ).stdout
    fields: dict[str, str] = {}
    key = ""
    for line in out.splitlines():
        if line[:1].isspace() and key:
            fields[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _mmdebstrap(rootfs: Path, includes: Sequence[str], log: Path) -> list[dict[str, str]]:
    """Extract ``includes`` and their dependencies into ``rootfs``; the packages' control data.

    The ``extract`` variant unpacks packages without running maintainer scripts: nothing in
    the image needs them, and the image then needs no shell. The downloaded .debs are kept
    (``--skip=cleanup/apt/cache``) to read their control data, then removed.
    """
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date_epoch())}
    try:
        _mmdebstrap_run(rootfs, includes, log, env)
    except ImageError as err:
        if re.search(r"Version '[^']+' for '[^']+' was not found", str(err)):
            raise ImageError(
                f"{err}\nA pinned Debian version is gone from the mirror (a point release or "
                f"security update replaced it): run `python -m tools.image lock` and commit "
                f"{PACKAGES_LOCK.name}"
            ) from err
        raise
    debs = sorted((rootfs / "var/cache/apt/archives").glob("*.deb"))
    if not debs:
        raise ImageError(f"mmdebstrap left no packages in {rootfs}/var/cache/apt/archives")
    return [_deb_fields(d) for d in debs]


def _mmdebstrap_run(rootfs: Path, includes: Sequence[str], log: Path, env: dict[str, str]) -> None:
    _run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=extract",
            f"--architectures={ARCH}",
            "--format=directory",
            "--skip=cleanup/apt/cache",
            f"--include={','.join(includes)}",
            SUITE,
            rootfs,
            *host_mirrors(),
        ],
        log,
        env=env,
    )


def _dpkg_status(packages: list[dict[str, str]]) -> str:
    """A dpkg status file, so image scanners (trivy, grype) see what is installed."""
    order = ("Package", "Status", "Priority", "Section", "Installed-Size", "Maintainer",
             "Architecture", "Multi-Arch", "Source", "Version", "Replaces", "Provides",
             "Depends", "Pre-Depends", "Recommends", "Suggests", "Breaks", "Conflicts",
             "Description")  # fmt: skip
    blocks = []
    for fields in sorted(packages, key=lambda f: f["Package"]):
        fields = {**fields, "Status": "install ok installed"}
        lines = [f"{k}: {fields[k]}" for k in order if k in fields]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def read_packages_lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in PACKAGES_LOCK.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("=")
            pins[name] = version
    return pins


# --------------------------------------------------------------------------- lock


def lock() -> None:
    """Resolve both pins afresh and rewrite the two lock files.

    Debian: the dependency closure of ``ROOT_PACKAGES`` as the mirror has it today.
    Wheels: ``reporter/requirements.txt`` with its dependencies, for the image's Python.
    """
    if os.geteuid() != 0:
        raise ImageError("locking runs mmdebstrap in root mode: run as root")
    ensure_host_tools(["mmdebstrap"])
    with tempfile.TemporaryDirectory(prefix="pmem-image-lock-") as tmp:
        work = Path(tmp)
        log = work / "lock.log"
        packages = _mmdebstrap(work / "rootfs", ROOT_PACKAGES, log)
        lines = [
            "# Debian packages of the reporter image (bookworm, amd64): the dependency closure",
            f"# of {' '.join(ROOT_PACKAGES)}. Written by `python -m tools.image lock`; a Debian",
            "# point release or security update removes old versions from the mirror, then",
            "# re-lock and commit (the image digest changes, as it should).",
            *sorted(f"{p['Package']}={p['Version']}" for p in packages),
        ]
        PACKAGES_LOCK.write_text("\n".join(lines) + "\n", encoding="utf-8")
        wheels = work / "wheels"
        _run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
             *_wheel_tag_args(), "-r", REQUIREMENTS, "-d", wheels],
            log,
            env=_pip_env(),
        )  # fmt: skip
        reqs = []
        for whl in sorted(wheels.glob("*.whl")):
            name, version = whl.name.split("-")[:2]
            digest = hashlib.sha256(whl.read_bytes()).hexdigest()
            reqs.append(f"{name.replace('_', '-').lower()}=={version} --hash=sha256:{digest}")
        WHEELS_LOCK.write_text(
            "# Every wheel of the reporter image: reporter/requirements.txt and its dependencies\n"
            "# for CPython 3.11, manylinux x86_64. Written by `python -m tools.image lock`.\n"
            + "\n".join(sorted(reqs))
            + "\n",
            encoding="utf-8",
        )
    _log(f"wrote {PACKAGES_LOCK.relative_to(PROJECT_DIR)} ({len(packages)} packages) and "
         f"{WHEELS_LOCK.relative_to(PROJECT_DIR)} ({len(reqs)} wheels)")  # fmt: skip


# --------------------------------------------------------------------------- build


def _iso(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reproducible_tar(src: Path, out: Path, log: Path, epoch: int) -> None:
    """A tar of ``src`` whose bytes depend only on the files' content, modes and names."""
    _run(
        [
            "tar",
            "--create",
            f"--file={out}",
            f"--directory={src}",
            "--format=posix",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
            "--sort=name",
            f"--mtime=@{epoch}",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            ".",
        ],
        log,
    )


def _populate(rootfs: Path, work: Path, packages: list[dict[str, str]], log: Path) -> None:
    """Everything above the Debian packages: wheels, sources, user, byte code, pruning."""
    uid = reporter_uid()
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    _run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--no-deps", "--require-hashes", *_wheel_tag_args(), "-r", WHEELS_LOCK, "-d", wheels],
        log,
        env=_pip_env(),
    )  # fmt: skip
    site = rootfs / SITE_PACKAGES
    wanted = work / "requirements-installed.txt"
    wanted.write_text(
        "".join(
            line + "\n"
            for line in WHEELS_LOCK.read_text(encoding="utf-8").splitlines()
            if line.split("==")[0] not in UNUSED_DISTRIBUTIONS
        ),
        encoding="utf-8",
    )
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-index", f"--find-links={wheels}", "--no-deps", "--require-hashes",
         "--no-compile", *_wheel_tag_args(), "--target", site, "-r", wanted],
        log,
        env=_pip_env(),
    )  # fmt: skip
    # Console scripts carry the build host's interpreter path (so the checkout's path would
    # reach the digest); the reporter needs none. Their RECORD lines go with them.
    shutil.rmtree(site / "bin", ignore_errors=True)
    for record in site.glob("*.dist-info/RECORD"):
        lines = record.read_text(encoding="utf-8").splitlines(keepends=True)
        record.write_text(
            "".join(line for line in lines if not line.startswith("../../bin/")),
            encoding="utf-8",
        )
    for rel in UNUSED_PATHS:
        shutil.rmtree(site / rel)
    for rel in reporter_sources():
        dest = site / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT_DIR / rel, dest)
    etc = rootfs / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"reporter:x:{uid}:{uid}:pmem-csi reporter:/nonexistent:/usr/sbin/nologin\n",
        encoding="utf-8",
    )
    (etc / "group").write_text(f"root:x:0:\nreporter:x:{uid}:\n", encoding="utf-8")
    dpkg = rootfs / "var/lib/dpkg"
    dpkg.mkdir(parents=True, exist_ok=True)
    (dpkg / "status").write_text(_dpkg_status(packages), encoding="utf-8")
    for rel in PRUNE:
        shutil.rmtree(rootfs / rel, ignore_errors=True)
    for rel in ("tmp", "var/tmp"):
        (rootfs / rel).mkdir(parents=True, exist_ok=True)
        (rootfs / rel).chmod(0o1777)
    # The runtime provides /dev; device nodes in a layer only get in its way.
    for node in (rootfs / "dev").iterdir():
        if node.is_dir() and not node.is_symlink():
            shutil.rmtree(node)
        else:
            node.unlink()
    # Byte code with hash-based invalidation: no mtimes inside, and nothing has to be
    # written at run time (the root filesystem is read-only in the pod).
    _run(
        [shutil.which("chroot") or "/usr/sbin/chroot", rootfs,
         PYTHON, "-m", "compileall", "-q", "-j", "1", "--invalidation-mode", "unchecked-hash",
         "/usr/lib/python3.11", f"/{SITE_PACKAGES}"],
        log,
        env={"PATH": "/usr/bin:/bin", "SOURCE_DATE_EPOCH": str(source_date_epoch())},
    )  # fmt: skip


def _image_config(image: BuiltImage, log: Path, epoch: int) -> None:
    uid = reporter_uid()
    created = _iso(epoch)
    _run(
        [
            "umoci", "config", "--image", image.ref,
            "--created", created, "--author", "pmem-csi-pulumi",
            "--architecture", ARCH, "--os", "linux",
            "--config.user", f"{uid}:{uid}",
            "--config.entrypoint", PYTHON, "--config.entrypoint", "-m",
            "--config.entrypoint", "reporter",
            "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
            "--config.env", "PYTHONUNBUFFERED=1",
            "--config.env", "PYTHONDONTWRITEBYTECODE=1",
            "--config.workingdir", "/",
            "--config.exposedports", f"{METRICS_PORT}/tcp",
            "--config.label", f"org.opencontainers.image.title={IMAGE_TITLE}",
            "--config.label", f"org.opencontainers.image.created={created}",
            "--history.created", created,
            "--history.created_by", "python -m tools.image build (config)",
        ],
        log,
    )  # fmt: skip


def _manifest_digest(layout: Path) -> str:
    index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    (manifest,) = index["manifests"]
    return str(manifest["digest"])


def build(force: bool = False, root: Path | None = None) -> BuiltImage:
    """Build the image unless its cache entry exists; a file lock serializes builders.

    ``root`` puts the entry elsewhere than the cache (the reproducibility test builds a
    second copy there); downloaded wheels are always shared in the cache.
    """
    key = cache_key()
    root = root or cache_root()
    image = BuiltImage(root / f"reporter-{key}")
    # Also when cached: pushing (skopeo) and the runc test need them.
    ensure_host_tools()
    if image.exists() and not force:
        return image
    if os.geteuid() != 0:
        raise ImageError("building the image needs root (mmdebstrap --mode=root, chroot)")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".reporter-{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if image.exists() and not force:
            return image
        return _build_locked(image)


def _build_locked(image: BuiltImage) -> BuiltImage:
    started = time.monotonic()
    epoch = source_date_epoch()
    pins = read_packages_lock()
    work = Path(tempfile.mkdtemp(prefix=f"{image.dir.name}.", dir=image.dir.parent))
    log = work / "build.log"
    try:
        _log(f"building {image.dir.name} (log {log})")
        rootfs = work / "rootfs"
        packages = _mmdebstrap(rootfs, [f"{n}={v}" for n, v in sorted(pins.items())], log)
        got = {p["Package"]: p["Version"] for p in packages}
        if got != pins:
            extra = sorted(set(got.items()) - set(pins.items()))
            absent = sorted(set(pins.items()) - set(got.items()))
            raise ImageError(
                f"the packages resolved differ from {PACKAGES_LOCK.name}: not locked {extra}, "
                f"locked but not resolved {absent}; run `python -m tools.image lock`"
            )
        _populate(rootfs, work, packages, log)
        layer = work / "layer.tar"
        _reproducible_tar(rootfs, layer, log, epoch)
        staged = BuiltImage(work)
        _run(["umoci", "init", "--layout", staged.layout], log)
        _run(["umoci", "new", "--image", staged.ref], log)
        _run(
            ["umoci", "raw", "add-layer", "--image", staged.ref,
             "--history.created", _iso(epoch),
             "--history.created_by", "python -m tools.image build (root filesystem)", layer],
            log,
        )  # fmt: skip
        _image_config(staged, log, epoch)
        _run(["umoci", "gc", "--layout", staged.layout], log)
        _reproducible_tar(staged.layout, staged.archive, log, epoch)
        _run(["skopeo", "inspect", f"oci-archive:{staged.archive}"], log)
        (work / "digest").write_text(_manifest_digest(staged.layout) + "\n", encoding="utf-8")
        shutil.rmtree(rootfs)
        layer.unlink()
        if image.dir.exists():
            shutil.rmtree(image.dir)
        work.rename(image.dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _log(f"built {image.digest} in {time.monotonic() - started:.0f}s: {image.dir}")
    _prune(image.dir.parent, keep=KEEP_ENTRIES)
    return image


def _prune(root: Path, keep: int) -> None:
    """Drop all but the ``keep`` newest entries: each holds about 100 MB (layout + archive)."""
    entries = sorted(
        (p for p in root.glob("reporter-*") if (p / "digest").is_file()),
        key=lambda p: (p / "digest").stat().st_mtime,
        reverse=True,
    )
    for old in entries[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def size_bytes(image: BuiltImage) -> dict[str, int]:
    """Compressed size (the layer blobs a registry stores) and the archive's size."""
    layout = image.layout
    index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((layout / "blobs/sha256" / digest).read_text(encoding="utf-8"))
    return {
        "compressed": sum(int(layer["size"]) for layer in manifest["layers"]),
        "archive": image.archive.stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.image", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the reporter image unless cached")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    sub.add_parser("lock", help="re-resolve the Debian and wheel pins")
    sub.add_parser("path", help="print the cache entry of the current inputs")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "lock":
            lock()
            return 0
        if args.cmd == "path":
            print(entry().dir)
            return 0
        image = build(force=args.force)
    except ImageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    sizes = size_bytes(image)
    print(f"layout  {image.layout} (oci:{image.ref})")
    print(f"archive {image.archive} (oci-archive:{image.archive})")
    print(f"digest  {image.digest}")
    print(f"size    {sizes['compressed'] / 2**20:.1f} MiB compressed layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
