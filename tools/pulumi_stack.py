"""Run a Pulumi program on a local stack through the Automation API.

The README's commands, ``make demo`` and tests/e2e/test_cli.py run the ``pulumi`` CLI itself
(the program started by the stand-in language host next to the CLI, see tools/langhost.py).
Tests that need many short-lived stacks, each with a program of its own, use this instead: with
an inline program the Python SDK serves the language runtime in this process and hands its
address to the CLI, so the same engine, provider and transforms run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

from tools import localenv, toolchain

PROJECT_NAME = "pmem-csi-pulumi"


def _command() -> auto.PulumiCommand:
    pulumi_bin = toolchain.bin_path("pulumi")
    return auto.PulumiCommand(root=str(pulumi_bin.parent.parent), skip_version_check=False)


def select_stack(
    stack_name: str,
    program: Callable[[], None],
    work_dir: Path,
    config: dict[str, Any] | None = None,
    secret_config: dict[str, str] | None = None,
) -> auto.Stack:
    """Create or select ``stack_name`` in ``work_dir`` (which holds Pulumi.yaml).

    ``config`` (plain values, structured allowed) is written to ``Pulumi.<stack>.yaml`` when
    given; ``secret_config`` entries (path-style keys such as
    ``pmem-csi:deployments[0].certificates.registryKey``) are stored encrypted.
    """
    env = localenv.apply_pulumi_env()
    work_dir.mkdir(parents=True, exist_ok=True)
    if not (work_dir / "Pulumi.yaml").exists():
        (work_dir / "Pulumi.yaml").write_text(
            yaml.safe_dump({"name": PROJECT_NAME, "runtime": "python", **project_config()})
        )
    if config is not None:
        write_stack_config(work_dir, stack_name, config)
    workspace_opts = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir),
        pulumi_home=env["PULUMI_HOME"],
        env_vars=env,
        secrets_provider="passphrase",
        pulumi_command=_command(),
    )
    stack = auto.create_or_select_stack(
        stack_name=stack_name, project_name=PROJECT_NAME, program=program, opts=workspace_opts
    )
    for key, value in (secret_config or {}).items():
        stack.set_config(key, auto.ConfigValue(value=value, secret=True), path=True)
    return stack


def project_config() -> dict[str, Any]:
    """The project's own Pulumi.yaml ``config`` (provider settings every stack of the project
    gets, such as ``kubernetes:enableSecretMutable``), so that test stacks run as the
    project's stacks do."""
    project = yaml.safe_load((toolchain.PROJECT_DIR / "Pulumi.yaml").read_text()) or {}
    return {"config": project["config"]} if project.get("config") else {}


def write_stack_config(work_dir: Path, stack_name: str, config: dict[str, Any]) -> None:
    """Replace the plain ``config`` of ``Pulumi.<stack>.yaml``, as an administrator edits it.

    Other top-level keys are kept: for passphrase stacks the file also holds the
    ``encryptionsalt``, without which the stack's existing secrets could not be decrypted.
    Secret values set with :func:`select_stack`'s ``secret_config`` live under ``config`` too,
    so callers that change config of a stack with secrets must pass them again.
    """
    path = work_dir / f"Pulumi.{stack_name}.yaml"
    settings = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    settings["config"] = config
    path.write_text(yaml.safe_dump(settings, sort_keys=False))


def printer(prefix: str = "") -> Callable[[str], None]:
    """on_output callback that forwards engine progress to stderr (long runs show progress)."""

    def out(line: str) -> None:
        os.write(2, f"{prefix}{line.rstrip()}\n".encode())

    return out
