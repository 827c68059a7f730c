"""The project's local state directory and the offline Pulumi environment.

Every way this project runs Pulumi (the demo, the tests, an administrator trying the local
stack) takes its environment from :func:`pulumi_env`, so there is one place that says: file
backend inside the state directory, passphrase secrets, no update checks, no plugin downloads.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tools import toolchain

PROJECT_DIR = toolchain.PROJECT_DIR
# The test suite's own state directory, a subdirectory of the administrator's: `make test`
# never shares a cluster, a Pulumi backend or a stack with `make demo` or a local stack
# (tests/conftest.py).
TEST_SESSION_SUBDIR = "test-session"


def state_dir() -> Path:
    """Runtime state (kubeconfig, cluster files, Pulumi backend); never committed."""
    path = Path(os.environ.get("PMEM_CSI_STATE_DIR", PROJECT_DIR / ".state")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def kubeconfig_path() -> Path:
    return state_dir() / "kubeconfig"


def _passphrase_file() -> Path:
    """A random passphrase for the local stacks' secrets, created once per state directory."""
    path = state_dir() / "pulumi-passphrase"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path


def pulumi_home() -> Path:
    return state_dir() / "pulumi-home"


# The package name the component provider serves (provider/, pmem_components.provider_face).
SERVED_PACKAGE = "pmem-csi"


def forget_served_schema(env: Mapping[str, str]) -> None:
    """Remove the CLI's cached schema of the served package from ``env``'s PULUMI_HOME.

    The CLI keeps a plugin's schema in ``$PULUMI_HOME/schemas/<name>-<version>.json`` and uses
    it for as long as the file is newer than the plugin's directory (its change time). For a
    package added by path that directory is the checkout's ``provider/``, which does not change
    when ``pmem_components`` does: after a checkout of other code (another branch, a pull, an
    older copy of the project) the cache would serve the old code's schema, the same version
    number, and a YAML program would be checked against fields that are no longer (or not yet)
    there. So every CLI run that may load the package starts without it.
    """
    home = Path(env.get("PULUMI_HOME") or Path.home() / ".pulumi")
    for cached in (home / "schemas").glob(f"{SERVED_PACKAGE}-*.json"):
        cached.unlink(missing_ok=True)


def pulumi_env() -> dict[str, str]:
    """Environment for the Pulumi CLI and the Automation API, fully offline."""
    backend = state_dir() / "pulumi-backend"
    backend.mkdir(parents=True, exist_ok=True)
    venv_bin = PROJECT_DIR / ".venv" / "bin"
    # Only the CLI's own directory: it also holds pulumi-resource-pulumi-python and the stand-in
    # pulumi-language-python (whose `python3` is the project's, from .venv/bin). The Kubernetes
    # provider is registered with `pulumi plugin install` instead (a provider found on PATH
    # makes the CLI warn on every run).
    path = [str(toolchain.GROUPS["pulumi"].install_dir() / "bin")]
    yaml_host = toolchain.GROUPS["pulumi-yaml"]
    if yaml_host.is_built():
        # The YAML language host, found by the CLI on PATH (its bundled plugins are looked up
        # there and next to the CLI).
        path.append(str(yaml_host.install_dir() / "bin"))
    if venv_bin.is_dir():
        # pulumi-resource-pulumi-python (dynamic providers) runs `python3` from PATH.
        path.append(str(venv_bin))
    path.append(os.environ.get("PATH", ""))
    return {
        "PULUMI_BACKEND_URL": backend.as_uri(),
        "PULUMI_HOME": str(pulumi_home()),
        "PULUMI_CONFIG_PASSPHRASE_FILE": str(_passphrase_file()),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_SKIP_CONFIRMATIONS": "true",
        "PULUMI_COPILOT": "false",
        "KUBECONFIG": str(kubeconfig_path()),
        "PATH": os.pathsep.join(path),
        toolchain.LANGUAGE_HOST_DIR_ENV: str(language_host_dir()),
        # The dynamic-provider process unpickles classes from pmem_components by module name.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(PROJECT_DIR), os.environ.get("PYTHONPATH", "")) if p
        ),
    }


def ensure_kubernetes_plugin(home: Path | None = None) -> None:
    """Register the locally built provider so the CLI never tries to download it, in
    ``home`` (a PULUMI_HOME of its own) or the state directory's."""
    version = toolchain.PULUMI_KUBERNETES_VERSION
    home = home or pulumi_home()
    plugin_dir = home / "plugins" / f"resource-kubernetes-{version}"
    if (plugin_dir / "pulumi-resource-kubernetes").exists():
        return
    subprocess.run(
        [
            str(toolchain.bin_path("pulumi")),
            "plugin",
            "install",
            "resource",
            "kubernetes",
            version.lstrip("v"),
            "--file",
            str(toolchain.bin_path("pulumi-resource-kubernetes")),
        ],
        env={**os.environ, **pulumi_env(), "PULUMI_HOME": str(home)},
        check=True,
        capture_output=True,
    )


def language_host_dir() -> Path:
    """This checkout's copy of the stand-in host, which the launcher next to the CLI runs."""
    return state_dir() / "language-host"


def ensure_language_host() -> None:
    """Put the stand-in `pulumi-language-python` next to the CLI (see tools/langhost.py), and
    this checkout's host where the launcher runs it from (the CLI's directory is shared)."""
    group = toolchain.GROUPS["pulumi"]
    if group.is_built():
        toolchain.install_language_host(group.install_dir() / "bin")
    toolchain.install_language_host(language_host_dir())


def apply_pulumi_env() -> dict[str, str]:
    """Put the offline environment into this process (the Automation API reads os.environ)."""
    env = pulumi_env()
    os.environ.update(env)
    ensure_kubernetes_plugin()
    ensure_language_host()
    return env
