"""The resource transform that takes field ownership back before the provider applies.

For every Kubernetes object of a deployment, right before the engine diffs and applies it
(a transform runs then, with the final, resolved inputs), this reads the live object and, if
field managers other than Pulumi's and Kubernetes' own own fields of it
(:func:`pmem_components.takeover.is_foreign`):

1. rewrites ``metadata.managedFields`` with a JSON Patch: the foreign entries are merged
   into Pulumi's apply entry (guarded by a ``resourceVersion`` test);
2. applies the declared object (exactly the inputs the provider is about to apply) with
   ``force`` under Pulumi's own field manager, so declared values come back and whatever
   others added is removed -- also when the provider's diff, which compares only the fields
   the program declares, would see nothing (an added label, an appended list item).

The provider's own update then finds the declared state and no conflict. Each object taken
over is named in the CLI output with the managers and fields it was taken from. Nothing of
this runs in a preview (``pulumi preview`` and the preview of ``pulumi up``): there the
transform only reads and says what ``up`` would take over.

Why a transform and not a step before registration: only at this point are the inputs
complete (certificate values, transforms such as the stack config's patches); so the apply
here sends the same object as the provider.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.runtime import rpc

from pmem_components import fieldowners, kubecall, takeover

# Left alone: the CRD (the provider replaces it with a PUT and forces already) and
# namespaces, which administrators label for others' sake (pod security, network policies).
SKIPPED_TYPES = frozenset(
    {
        "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition",
        "kubernetes:core/v1:Namespace",
    }
)
REQUEST_TIMEOUT = 15
# Reads and patches of one object when someone else writes it in between.
ATTEMPTS = 5
# Marks, in a preview only, an object whose fields `pulumi up` will take over (see _marked).
PREVIEW_ANNOTATION = "pmem-csi.intel.com/fields-taken-over"


class TakeOverError(RuntimeError):
    """A take-over that could not be done (the update stops before the provider applies)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


async def _plain(value: Any) -> Any:
    """Resolved transform inputs as a plain object: secrets (wrapped or Outputs) unwrapped;
    raises :class:`_Unknown` for a value not known yet (a preview)."""
    if isinstance(value, pulumi.Output):
        if not await value.is_known():
            raise _Unknown
        value = await value.future()
    value = rpc.unwrap_rpc_secret(value)
    if value == rpc.UNKNOWN:
        raise _Unknown
    if isinstance(value, dict):
        # None means "not set" in the inputs; in an apply it would mean something else.
        return {k: await _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [await _plain(v) for v in value]
    return value


class _Unknown(Exception):
    pass


class KubeApi:
    """The three calls the take-over needs, through the Kubernetes client's auth and TLS."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any] | None:
        status, _, data = kubecall.request(
            self.api,
            method,
            path,
            timeout=REQUEST_TIMEOUT,
            body=body,
            content_type=content_type,
            query=query,
        )
        if status == 404 and method == "GET":
            return None
        if not 200 <= status <= 299:
            # The API server's reason, unless the object is a Secret: never risk echoing
            # key material into the CLI output.
            text = "" if "/secrets/" in path else f": {data[:300].decode(errors='replace')}"
            raise TakeOverError(f"{method} {path}: HTTP {status}{text}", status)
        return json.loads(data or b"{}")

    def get(self, path: str) -> dict[str, Any] | None:
        return self._call("GET", path)

    def json_patch(self, path: str, ops: Any, manager: str) -> dict[str, Any] | None:
        return self._call(
            "PATCH", path, list(ops), "application/json-patch+json", [("fieldManager", manager)]
        )

    def apply(self, path: str, obj: dict[str, Any], manager: str) -> dict[str, Any] | None:
        query = [("fieldManager", manager), ("force", "true")]
        return self._call("PATCH", path, obj, "application/apply-patch+yaml", query)


def object_path(obj: dict[str, Any]) -> str:
    from pmem_components.preflight import _path

    meta = obj.get("metadata") or {}
    return _path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


def describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{meta.get('name')}"


@dataclass(frozen=True)
class Outcome:
    """What :func:`correct` did (or, in a dry run, would do) to one object."""

    plan: takeover.TakeOver
    message: str  # the CLI line


def correct(api: KubeApi, obj: dict[str, Any], dry_run: bool) -> Outcome | None:
    """Take over one object (see the module docstring); returns what was taken, if anything.

    In a dry run nothing is written; the message says what ``pulumi up`` would do.
    """
    path = object_path(obj)
    for attempt in range(ATTEMPTS):
        live = api.get(path)
        if live is None:
            return None  # not there: the provider creates it
        meta = live.get("metadata") or {}
        managed = meta.get("managedFields") or []
        plan = takeover.plan(managed, str(meta.get("resourceVersion", "")))
        if plan is None:
            return None
        what = fieldowners.describe(fieldowners.foreign_owners(managed)) or ", ".join(plan.foreign)
        if dry_run:
            return Outcome(plan, f"pulumi up would take over fields of {describe(obj)} ({what})")
        try:
            api.json_patch(path, plan.patch, plan.manager)
        except TakeOverError as err:
            # Written in between (a controller's status update, say): the resourceVersion
            # test failed. Read again.
            if err.status in (409, 422) and attempt + 1 < ATTEMPTS:
                continue
            raise
        api.apply(path, obj, plan.manager)
        return Outcome(plan, f"took over fields of {describe(obj)} and applied it ({what})")
    return None


_EXECUTORS: list[concurrent.futures.ThreadPoolExecutor] = []


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """Threads of our own for the blocking API calls. Not the event loop's default executor:
    the Pulumi SDK blocks its threads in RegisterResource calls, which wait for this
    transform; with many resources they are all taken and the update would hang."""
    if not _EXECUTORS:
        _EXECUTORS.append(
            concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="takeover")
        )
    return _EXECUTORS[0]


def transform(
    client_factory: Callable[[], Any],
    *,
    log: Callable[[str], None] | None = None,
) -> pulumi.ResourceTransform:
    """The transform; ``client_factory`` makes the Kubernetes API client (once, when first
    needed) the way the provider connects."""
    clients: list[KubeApi] = []

    def api() -> KubeApi:
        if not clients:
            clients.append(KubeApi(client_factory()))
        return clients[0]

    def info(message: str) -> None:
        (log or pulumi.log.info)(message)

    async def apply(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if not args.custom or not args.type_.startswith("kubernetes:"):
            return None
        if args.type_ in SKIPPED_TYPES:
            return None
        try:
            obj = await _plain(dict(args.props))
        except _Unknown:
            return None  # a preview with inputs not known yet: nothing to compare with
        dry_run = pulumi.runtime.is_dry_run()
        try:
            loop = asyncio.get_running_loop()
            outcome = await loop.run_in_executor(_executor(), correct, api(), obj, dry_run)
        except Exception as err:
            message = f"cannot take over fields of {describe(obj)}: {err}"
            if dry_run:
                pulumi.log.warn(f"{message} (pulumi up will try again)")
                return None
            raise TakeOverError(
                f"{message}; set pmem-csi:takeOverFields: false to leave fields that other "
                "field managers own to them"
            ) from None
        if outcome is None:
            return None
        info(outcome.message)
        if not dry_run:
            return None
        return pulumi.ResourceTransformResult(props=_marked(args.props), opts=args.opts)

    return apply


def _marked(props: dict[str, Any]) -> dict[str, Any]:
    """The preview's inputs of an object that ``up`` will take over: with an annotation whose
    value is unknown until the update (:data:`PREVIEW_ANNOTATION`).

    Why: the provider previews an update with a dry-run apply against the object as it is,
    foreign fields included (a Service port someone added makes the declared ports invalid,
    for example), not as the take-over will leave it. An unknown input makes it show the
    update without that dry run, as for any input computed during the update. The real
    update never sets the annotation.
    """
    out = dict(props)
    meta = dict(out.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), PREVIEW_ANNOTATION: rpc.UNKNOWN}
    out["metadata"] = meta
    return out
