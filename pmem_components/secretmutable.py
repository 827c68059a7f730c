"""The Kubernetes provider's ``enableSecretMutable``: certificate renewal needs it on.

Generated certificates change while the driver runs (renewal, the stages of a CA change), and
each change must update the driver's Secrets in place. With ``enableSecretMutable`` off the
provider replaces a Secret whose data changes, by delete then create (the name is fixed): for
a moment the Secret does not exist (a pod starting then fails to mount it; an interrupted run
leaves it missing). One rule for every path that deploys generated certificates: the stack
program (this project's ``Pulumi.yaml`` sets it), and the component in library use or served
to other languages, through the default provider (the consumer's stack config).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

KEY = "kubernetes:enableSecretMutable"
ENV = "PULUMI_K8S_ENABLE_SECRET_MUTABLE"

_WHY = (
    "certificate renewal updates the driver's Secrets, and without it the Kubernetes "
    "provider deletes and re-creates them (the driver is without certificates meanwhile)"
)
_SET_TRUE = f"pulumi config set {KEY} true"


def problems(
    generated: Sequence[Any],
    setting: str | None,
    env: Mapping[str, str],
    *,
    this_project: bool = True,
) -> list[str]:
    """The problem with the default provider's setting, if any deployment in ``generated``
    (those whose certificates are generated) is deployed through it.

    The provider reads the stack config's ``kubernetes:enableSecretMutable``, else the
    environment variable, as here (pulumi-kubernetes ``Configure``: only ``"true"`` is on).
    ``this_project``: the stack is this project's (its ``Pulumi.yaml`` sets the value), not a
    program of the administrator's own using the component.
    """
    if not generated:
        return []
    if setting is not None:
        if setting == "true":
            return []
        ignored = (
            f" ({ENV} in the environment does not count while the config sets it)"
            if ENV in env
            else ""
        )
        fix = (
            f"Pulumi.yaml sets it true for this project: remove the stack's own setting "
            f"(pulumi config rm {KEY}), or, if your Pulumi.yaml sets it otherwise, set it "
            f"true ({_SET_TRUE})"
            if this_project
            else f"set it true in this stack's config ({_SET_TRUE}, or under config: in "
            "Pulumi.yaml)"
        )
        return [f"{KEY}: is {setting!r}, but must be true{ignored}: {_WHY}. {fix}"]
    if ENV in env:
        if env[ENV] == "true":
            return []
        return [
            f"{KEY}: is not set, and {ENV} is {env[ENV]!r} in the environment (the provider "
            f"reads it then), but it must be true: {_WHY}; unset {ENV} and set the config "
            f"({_SET_TRUE}), or set the variable to true"
        ]
    fix = (
        f"This project's Pulumi.yaml sets it; a project file without it (an older copy, a "
        f"program of your own) needs it: {_SET_TRUE} (or {ENV}=true in the environment)"
        if this_project
        else f"Set it in this stack's config: {_SET_TRUE} (or {KEY}: true under config: in "
        f"Pulumi.yaml, or {ENV}=true in the environment)"
    )
    return [f"{KEY}: is not set (the provider's default is false), but must be true: {_WHY}. {fix}"]
