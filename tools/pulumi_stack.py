"""Run a Pulumi program on a local stack through the Automation API.

The README's commands, ``make demo`` and tests/e2e/test_cli.py run the ``pulumi`` CLI itself
(the program started by the stand-in language host next to the CLI, see tools/langhost.py).
Tests that need many short-lived stacks, each with a program of its own, use this instead: with
an inline program the Python SDK serves the language runtime in this process and hands its
address to the CLI, so the same engine, provider and transforms run.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

# Not exported by pulumi.automation, but Stack's constructor takes it; the SDK is pinned.
from pulumi.automation._stack import StackInitMode

from tools import localenv, toolchain

PROJECT_NAME = "pmem-csi-pulumi"


@functools.cache
def _command() -> auto.PulumiCommand:
    """The locally built CLI, its version checked once per process (the SDK runs
    ``pulumi version`` for every ``PulumiCommand`` it is given)."""
    pulumi_bin = toolchain.bin_path("pulumi")
    return auto.PulumiCommand(root=str(pulumi_bin.parent.parent), skip_version_check=False)


class Stack(auto.Stack):
    """An Automation API stack whose update summaries keep secret config encrypted.

    After every ``up``, ``refresh`` and ``destroy`` the SDK reads the update's summary with
    ``pulumi stack history``, by default with ``--show-secrets``: that opens the stack's
    passphrase secrets manager, one more key derivation (1,000,000 PBKDF2 rounds, about 0.3
    CPU-seconds) per operation. The callers here read the summary's counts and result, never a
    decrypted config value, so the summary leaves secrets as they are stored.
    """

    def info(self, show_secrets: bool = True) -> auto.UpdateSummary | None:
        """The last update's summary, secrets left encrypted whatever ``show_secrets`` says
        (the SDK's ``up`` always passes True, so a caller's True cannot be told apart)."""
        return super().info(show_secrets=False)


def select_stack(
    stack_name: str,
    program: Callable[[], None],
    work_dir: Path,
    config: dict[str, Any] | None = None,
    secret_config: dict[str, str] | None = None,
) -> Stack:
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
    workspace = auto.LocalWorkspace(
        work_dir=str(work_dir),
        pulumi_home=env["PULUMI_HOME"],
        program=program,
        env_vars=env,
        secrets_provider="passphrase",
        pulumi_command=_command(),
    )
    stack = _created_or_selected(stack_name, workspace)
    if secret_config:  # one `pulumi config set-all`: one key derivation for all of them
        secrets = {k: auto.ConfigValue(value=v, secret=True) for k, v in secret_config.items()}
        stack.set_all_config(secrets, path=True)
    return stack


def _created_or_selected(stack_name: str, workspace: auto.LocalWorkspace) -> Stack:
    """``stack_name`` created, or selected when it exists: creation first, since nearly every
    stack here is new (the SDK's own order, select then create, costs a failed ``pulumi stack
    select`` for each new stack)."""
    try:
        return Stack(stack_name, workspace, StackInitMode.CREATE)
    except auto.StackAlreadyExistsError:
        return Stack(stack_name, workspace, StackInitMode.SELECT)


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
