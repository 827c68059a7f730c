"""Which stack an object belongs to: the stack's identity and the stack's own state.

**The identity** written into :data:`pmem_components.names.STACK_ANNOTATION` is
``<organization>/<project>/<stack>`` (``organization`` on file, S3 and PostgreSQL backends,
the Pulumi Cloud organization there). Before this module it was ``<project>/<stack>``; both
forms are read. It names the owner in messages, but it cannot prove ownership: two teams can
run a ``pmem-csi-pulumi/prod`` stack on two backends against one cluster, and ``pulumi stack
rm`` followed by ``pulumi stack init`` of the same name makes a new stack with the old name.
The program is not told which backend it runs on (the engine passes organization, project
and stack, nothing else; ``PULUMI_BACKEND_URL`` is there only when the user set it, and it
may hold a host and user name that do not belong in cluster annotations). Putting the backend
into the identity would also make a stack moved to another backend with ``pulumi stack
export``/``import`` (README, "Choosing a state backend") a stranger to its own objects.

**What is unique about a stack is its state.** So ownership is decided by it: a live object
belongs to this stack when this stack's state holds it (same group, kind, namespace and name,
and the same ``metadata.uid`` when the state recorded one), whatever its annotation says (an
upgraded stack's ``<project>/<stack>`` annotations, a renamed stack's old name). An object
annotated with *this* stack's identity that the state does not hold was retained by an earlier
stack of this name or is managed by a same-named stack on another backend; the preflight
adopts it only with the administrator's consent (``pmem-csi:adopt``).

The program reads its state before it registers anything with the engine's built-in
``pulumi:pulumi:readStackResourceOutputs`` invoke for its own stack, the call behind
``StackReference`` resource outputs: synchronous for the program, served by every backend,
in ``preview`` and ``up`` alike, and it records nothing in the state. The state also tells
each object's field manager (``__fieldManager``): the take-over uses it to recognise another
stack's Pulumi manager on an adopted object (:mod:`pmem_components.takeover`), and the inputs
the provider recorded at the last update (``__inputs``) beside the object it got back: the
provider decides a replacement from those, and so does the preflight
(:data:`pmem_components.preflight.PROVIDER_FORCE_NEW`).

:func:`state_from_outputs` and :func:`names_this_stack` are pure; :func:`read_state` is the
one call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

READ_STATE_TOKEN = "pulumi:pulumi:readStackResourceOutputs"
# The provider's own output keys in the state (pulumi-kubernetes).
FIELD_MANAGER_KEY = "__fieldManager"
INPUTS_KEY = "__inputs"


def identity(organization: str, project: str, stack: str) -> str:
    """The value of the stack annotation on what this stack owns."""
    return f"{organization}/{project}/{stack}"


def names_this_stack(value: str | None, stack_identity: str) -> bool:
    """Whether an annotation value names this stack: the full identity, or its
    ``<project>/<stack>`` tail (what the program wrote before the organization was part of it).
    """
    if not value:
        return False
    return value == stack_identity or value == stack_identity.split("/", 1)[-1]


@dataclass(frozen=True)
class Held:
    """What the state recorded about one Kubernetes object."""

    uid: str
    field_manager: str
    # Its URN in the state: what `pulumi state delete` takes (the refusals name it).
    urn: str = ""
    # What the provider recorded at the last update: the inputs it was given (``__inputs``)
    # and the object as the API server returned it (the other outputs). The provider decides
    # a replacement from these, never from the cluster (preflight's forceNew check).
    inputs: Mapping[str, Any] | None = None
    outputs: Mapping[str, Any] | None = None


ObjectKey = tuple[str, str, str, str]  # (API group, kind, namespace, name)


def object_key(api_version: str, kind: str, namespace: str, name: str) -> ObjectKey:
    """The key of an object in :class:`StackState`: the group, not the version (the state may
    record another version of the same object)."""
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return (group, kind, namespace or "", name)


@dataclass(frozen=True)
class StackState:
    """The Kubernetes objects this stack's state holds (read before anything is registered)."""

    objects: Mapping[ObjectKey, Held] = field(default_factory=dict)
    # The stored stage (``phase`` output) of each generated certificate set, by resource
    # name: the preflight reads the driver pods only where a CA change is under way.
    certificate_phases: Mapping[str, str] = field(default_factory=dict)
    # The stack identity the state was read for (``<organization>/<project>/<stack>``): an
    # object it holds that is annotated with another stack's identity was applied by that
    # stack since (an adoption, with or without the take-over). Empty: not known.
    stack_id: str = ""

    def holds(self, key: ObjectKey, uid: str = "") -> bool:
        """Whether the state holds this object; an object of the name with another uid
        (deleted and made anew by someone else) is not the one the state holds."""
        held = self.objects.get(key)
        if held is None:
            return False
        return not (uid and held.uid and uid != held.uid)

    def field_manager(self, key: ObjectKey) -> str | None:
        held = self.objects.get(key)
        return held.field_manager if held is not None and held.field_manager else None

    def urn(self, key: ObjectKey) -> str | None:
        held = self.objects.get(key)
        return held.urn if held is not None and held.urn else None

    def recorded(self, key: ObjectKey) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
        """(inputs, outputs) the provider recorded for the object at its last update; None
        when the state holds no inputs for it (not held, or not the provider's)."""
        held = self.objects.get(key)
        if held is None or held.inputs is None or held.outputs is None:
            return None
        return held.inputs, held.outputs

    def namespaces(self) -> list[str]:
        """The names of the namespaces the state holds."""
        return [name for group, kind, _, name in self.objects if (group, kind) == ("", "Namespace")]


def _plain(value: Any) -> Any:
    """A state value without the SDK's secret wrapper (``{sig: ..., value: ...}``)."""
    if isinstance(value, Mapping) and "value" in value and len(value) <= 2:
        sig = value.get("4dabf18193072939515e22adb298388d")
        if sig is not None:
            return value["value"]
    return value


def _deep_plain(value: Any) -> Any:
    """``value`` with every nested secret wrapper removed (a Secret's recorded inputs hold
    them), as plain dicts and lists."""
    value = _plain(value)
    if isinstance(value, Mapping):
        return {str(k): _deep_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_deep_plain(v) for v in value]
    return value


# The dynamic certificate resource's type (cert_resource.GeneratedCertificates).
CERTIFICATES_TYPE = "pulumi-python:dynamic/pmem-csi:Certificates"


def state_from_outputs(result: Mapping[str, Any] | None) -> StackState:
    """The invoke's answer (``{"outputs": {urn: {"type": ..., "outputs": {...}}}}``) as the
    Kubernetes objects it holds. Providers and other resources are left out."""
    objects: dict[ObjectKey, Held] = {}
    phases: dict[str, str] = {}
    resources = (result or {}).get("outputs") or {}
    for urn, entry in resources.items():
        if not isinstance(entry, Mapping):
            continue
        type_ = str(entry.get("type") or "")
        if type_ == CERTIFICATES_TYPE:
            outs = _plain(entry.get("outputs")) or {}
            if isinstance(outs, Mapping):
                phases[str(urn).rsplit("::", 1)[-1]] = str(_plain(outs.get("phase")) or "")
            continue
        if not type_.startswith("kubernetes:") or type_.startswith("pulumi:providers:"):
            continue
        outs = _plain(entry.get("outputs")) or {}
        if not isinstance(outs, Mapping):
            continue
        meta = _plain(outs.get("metadata")) or {}
        if not isinstance(meta, Mapping) or not meta.get("name"):
            continue
        key = object_key(
            str(outs.get("apiVersion") or ""),
            str(outs.get("kind") or ""),
            str(meta.get("namespace") or ""),
            str(meta.get("name")),
        )
        inputs = _deep_plain(outs.get(INPUTS_KEY))
        objects[key] = Held(
            uid=str(meta.get("uid") or ""),
            field_manager=str(_plain(outs.get(FIELD_MANAGER_KEY)) or ""),
            urn=str(urn),
            inputs=inputs if isinstance(inputs, dict) else None,
            outputs={
                k: _deep_plain(v) for k, v in outs.items() if not str(k).startswith("__")
            },
        )
    return StackState(objects, phases)


class StateError(RuntimeError):
    """The stack's own state could not be read."""


READ_STATE_TRIES = 4
# What a DIY backend in the legacy layout (``.pulumi/meta.yaml`` version 0, or none in a bucket
# that held stacks before project-scoped ones: ``.pulumi/stacks/<stack>.json``) answers to a
# reference with a ``/``: it parses references as bare stack names (pulumi
# pkg/backend/diy/store.go, ``legacyReferenceStore.ParseReference``; sdk
# go/common/tokens/stack_name.go, ``ParseStackName``).
LEGACY_REFUSAL = "a stack name may only contain"


def legacy_reference(stack_name: str, reason: str) -> str | None:
    """The reference to try when the backend refused ``stack_name`` (``org/project/stack``)
    for ``reason``: the bare stack name, which is how a legacy-layout DIY backend names its
    stacks (there the stack's name alone is unique); None for any other refusal. Only then:
    elsewhere a bare name means the default organization's stack (Pulumi Cloud), which may
    be another stack than this one."""
    if "/" not in stack_name or LEGACY_REFUSAL not in reason:
        return None
    return stack_name.rsplit("/", 1)[-1]


def read_state(stack_name: str) -> StackState:
    """This stack's state as the backend has it now (``stack_name``: ``org/project/stack``).

    Before the program registers anything this is the state the update starts from.
    """
    import time

    import pulumi

    # The engine saves the checkpoint as the update starts (the Stack resource) while this
    # reads it: a read can meet a file being written ("failed to load checkpoint: EOF", seen
    # in tests/e2e/test_cli_interruptions.py). A few tries, then the engine's reason.
    asked = stack_name
    attempt = 0
    while True:
        try:
            result = pulumi.runtime.invoke(READ_STATE_TOKEN, {"stackName": stack_name})
            break
        except Exception as err:  # the engine's reason, for the preflight's message
            legacy = legacy_reference(stack_name, str(err))
            if legacy is not None:
                stack_name = legacy
                continue
            attempt += 1
            if attempt == READ_STATE_TRIES:
                raise StateError(f"{type(err).__name__}: {str(err)[:200]}") from None
            time.sleep(0.5 * attempt)
    value = getattr(result, "value", result)
    if not isinstance(value, Mapping):
        raise StateError(f"unexpected answer {type(value).__name__}")
    import dataclasses

    # The identity asked for, not the bare name of a legacy fallback: objects carry it.
    return dataclasses.replace(state_from_outputs(value), stack_id=asked)
