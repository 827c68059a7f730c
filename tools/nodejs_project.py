"""The TypeScript project of the tests: pinned npm dependencies and the stand-in Node.js host.

Why: ``tests/e2e/test_typescript_package.py`` runs the TypeScript path of
``docs/yaml-and-other-languages.md`` with the real CLI, and its npm dependencies must be the
same on every run. ``tools/nodejs/`` holds the project as ``pulumi new typescript`` lays it out
(``package.json`` with exact versions, ``tsconfig.json``) and the ``package-lock.json`` that
pins everything npm installs, the generated SDK's own dependencies included. npm's cache is in
the tools cache (``<tools cache>/npm``), and npm prefers it to the registry, so after the first
run nothing is downloaded.

``python -m tools.nodejs_project lock`` writes the lock file again (after a pin changed): in a
fresh copy of the project without it, ``pulumi package add <checkout>/provider`` (which
generates the SDK, links it and runs ``npm install``), then the resulting lock file is kept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tools import langhost_nodejs, localenv, toolchain

TEMPLATE_DIR = toolchain.TOOLS_DIR / "nodejs"
LOCK_FILE = "package-lock.json"
TEMPLATE_FILES = ("package.json", LOCK_FILE, "tsconfig.json")
PROVIDER_DIR = toolchain.PROJECT_DIR / "provider"
# The npm name `pulumi package add` links the component's SDK under, and where it puts it.
SDK_PACKAGE = "@pulumi/pmem-csi"
SDK_DIR = "sdks/pmem-csi"


def npm_cache_dir() -> Path:
    return toolchain.cache_root() / "npm"


def npm_env() -> dict[str, str]:
    """npm settings for every npm the CLI or a test starts: the cache in the tools cache,
    preferred to the registry; no audit, funding or update checks (each a registry call)."""
    return {
        "npm_config_cache": str(npm_cache_dir()),
        "npm_config_prefer_offline": "true",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
        "npm_config_update_notifier": "false",
    }


def new_project(dest: Path, *, with_lock: bool = True) -> Path:
    """Copy the template into ``dest`` (created), without the lock file when asked."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATE_FILES:
        if name == LOCK_FILE and not with_lock:
            continue
        shutil.copyfile(TEMPLATE_DIR / name, dest / name)
    return dest


def install_hosts(bin_dir: Path) -> Path:
    """This checkout's stand-in Python host and the Node.js host into ``bin_dir`` (for PATH).

    Both: ``pulumi package add`` of the component runs the provider through the Python host and
    the project's SDK generation, link and install through the Node.js one.
    """
    if not toolchain.GROUPS["pulumi-nodejs"].is_built():
        raise RuntimeError(
            "tool group pulumi-nodejs is not built: run `python -m tools.toolchain build "
            "pulumi-nodejs` (or `make tools`)"
        )
    toolchain.install_language_host(bin_dir)
    langhost_nodejs.install(bin_dir, toolchain.bin_path(langhost_nodejs.CODEGEN_BINARY))
    return bin_dir


def cli_env(base: Mapping[str, str], bin_dir: Path) -> dict[str, str]:
    """The offline Pulumi environment with the hosts of ``bin_dir`` first on PATH and npm's."""
    env = {**base, **localenv.pulumi_env(), **npm_env()}
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    return env


def lock() -> Path:
    """Write tools/nodejs/package-lock.json again from a fresh ``pulumi package add``."""
    with tempfile.TemporaryDirectory(prefix="pmem-ts-lock-") as tmp:
        project = new_project(Path(tmp) / "program", with_lock=False)
        (project / "Pulumi.yaml").write_text("name: pmem-ts-lock\nruntime: nodejs\n")
        env = cli_env(os.environ, install_hosts(Path(tmp) / "bin"))
        localenv.ensure_kubernetes_plugin()
        localenv.forget_served_schema(env)
        done = subprocess.run(
            [str(toolchain.bin_path("pulumi")), "package", "add", str(PROVIDER_DIR),
             "--non-interactive"],
            cwd=project, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pulumi package add failed:\n{done.stdout}\n{done.stderr}")
        shutil.copyfile(project / LOCK_FILE, TEMPLATE_DIR / LOCK_FILE)
    return TEMPLATE_DIR / LOCK_FILE


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["lock"]:
        print("usage: python -m tools.nodejs_project lock", file=sys.stderr)
        return 2
    print(f"wrote {lock()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
