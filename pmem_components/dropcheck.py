"""The adopted-away refusal for drops, also with ``pmem-csi:preflight: false``.

Why: an update that drops a deployment (no longer configured) or a namespace (no deployment
creates it any more) makes the engine delete what the state holds, and the Kubernetes
provider deletes by name. When another stack has adopted those objects since, they are that
stack's now (review of issue 14, item 4, D1). The preflight refuses that
(:func:`pmem_components.preflight._dropped_taken`), but ``preflight: false`` turns the
preflight off, and the drop would then delete the other stack's objects. A safety check
against deleting someone else's objects is not one of the checks an administrator means to
turn off, so with the preflight off it still runs -- for the drops only: the stack's state
(which needs no cluster access) tells whether the update drops anything; only then are the
dropped objects read, one GET each. An update that drops nothing reads nothing, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pmem_components import identity, kubetarget, names, preflight
from pmem_components.config import StackConfig

CR_API = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"
KEY = "pmem-csi:preflight"


def dropped(stack: StackConfig, state: identity.StackState) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every CR and namespace the state holds that this
    configuration no longer registers (as :func:`pmem_components.preflight.plan` counts
    them with the preflight on; with it off no namespace is kept for its users)."""
    configured = {d.name for d in stack.deployments}
    renamed = {d.renamed_from for d in stack.deployments if d.renamed_from}
    created = {d.namespace for d in stack.deployments if d.create_namespace}
    out = [
        (CR_API, names.CRD_KIND, name)
        for group, kind, _, name in state.objects
        if (group, kind) == (names.CRD_GROUP, names.CRD_KIND)
        and name not in configured
        and name not in renamed
    ]
    out += [("v1", "Namespace", ns) for ns in state.namespaces() if ns not in created]
    return out


def unreadable(api_version: str, kind: str, name: str, state: identity.StackState, why: str) -> str:
    """The refusal of a drop whose object cannot be read (``why``), with the ways forward:
    make it readable, keep it configured, or -- the cluster gone for good, where the
    provider's ``deleteUnreachable`` would drop it from the state -- forget it with
    ``pulumi state delete``, which never calls the provider."""
    kind_name = "the Deployment CR" if kind == names.CRD_KIND else kind.lower()
    urn = state.urn(identity.object_key(api_version, kind, "", name))
    return (
        f"{KEY}: false, but this update drops {kind_name} {name!r} from the state, which "
        "deletes it by name; the program reads it first to make sure no other stack has "
        f"taken it over since, and cannot ({why}). Make it readable for this update (get on "
        f"{kind_name}), or keep it configured; if the cluster is unreachable for good (the "
        "provider's deleteUnreachable), make this stack forget it without deleting anything: "
        f"{preflight.forget_command(kind, urn)}, then pulumi up"
    )


def check(
    drops: list[tuple[str, str, str]],
    state: identity.StackState,
    get: Callable[[str], dict[str, Any] | None],
) -> list[str]:
    """The refusals for the dropped objects another stack took over since; a drop whose
    object cannot be read is refused too (the program cannot tell whose it is)."""
    problems: list[str] = []
    for api_version, kind, name in drops:
        try:
            live = get(preflight._path(api_version, kind, None, name))
        except Exception as err:
            problems.append(unreadable(api_version, kind, name, state, kubetarget.error_text(err)))
            continue
        if live is None:
            continue  # gone: the delete deletes nothing
        obs = preflight._observed(live, kind)
        if not state.holds(obs.key, obs.uid):
            continue
        problem = preflight._dropped_taken(obs, state)
        if problem:
            problems.append(problem)
    return problems
