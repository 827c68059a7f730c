"""Whether an object's values have the types the Kubernetes API wants, before it is registered.

Why: ``pulumi config set --path`` stores an all-digit value as a number (and ``true`` as a
boolean), and a YAML edit does the same. A patch that puts such a value where the API wants a
string (a nodeSelector, a label, an env value) got through every check of the program; the API
server refused the object only when ``pulumi up`` created it, after the namespace and other
objects were already in the cluster. The preflight's server-side dry run covers objects that
exist live, not a first install. So the program checks the types of every patched object
itself, offline, in :meth:`pmem_components.patches.PatchSet.dry_run`.

Where the types come from (no hand-written schemas):

* built-in kinds: the ``kubernetes`` client's model classes (``openapi_types`` and
  ``attribute_map``, generated from the API's OpenAPI document), e.g. ``apps/v1
  StatefulSet`` -> ``V1StatefulSet``;
* the ``Deployment`` CR: its CRD's ``openAPIV3Schema`` (``crd/``), and ``ObjectMeta`` for its
  metadata, which the API server checks for custom resources too.

Accepted, because the API server accepts it (tests/e2e/test_bad_input_and_leaks.py asks a
real one): an integer or a string for an int-or-string field (``maxUnavailable``,
``targetPort``); a string or a number for a quantity (the client types quantities as strings,
so :data:`QUANTITY_FIELDS` names them); an integral float for an integer (Pulumi sends every
number as a double: ``2.0`` reaches the API server as ``2``); ``null`` anywhere (a merge
patch's ``null`` deletes the key; a JSON patch's ``null`` leaves the field unset).

Not checked here: fields the client's model does not know. The API server's server-side
apply refuses a field it does not know ("field not declared in schema", during ``pulumi up``),
but an API server newer than the client (37.0.2, Kubernetes 1.37) may know fields the model
lacks, and refusing them here would refuse valid input with no way around it; the
preflight's dry run catches them for objects that exist live. Nor kinds with no model, nor
values (enums, patterns, ranges): the API server's validation owns those.
"""

from __future__ import annotations

import functools
import json
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client
import pulumi.runtime.config as pulumi_config
from pydantic import BaseModel

from pmem_components import names
from pmem_components.config import QUANTITY, string_fix, sub_path

# Quantities (resource.Quantity): a string such as "100m" or a number. The client's models
# type them as plain strings, hence this list (of the models our kinds can contain; unit tests
# check that each names a field of the client's models, e2e ones that the API server accepts
# numbers there).
QUANTITY_FIELDS = frozenset(
    {
        ("V1ResourceRequirements", "limits"),
        ("V1ResourceRequirements", "requests"),
        ("V1VolumeResourceRequirements", "limits"),
        ("V1VolumeResourceRequirements", "requests"),
        ("V1PodSpec", "overhead"),
        ("V1EmptyDirVolumeSource", "size_limit"),
        ("V1ResourceFieldSelector", "divisor"),
        ("V1PersistentVolumeClaimStatus", "capacity"),
        ("V1PersistentVolumeClaimStatus", "allocated_resources"),
    }
)

STRING = "a string"
INTEGER = "an integer"
NUMBER = "a number"
BOOLEAN = "true or false"
INT_OR_STRING = "an integer or a string"
QUANTITY_TYPE = "a quantity (a string such as 100m or 1Gi, or a number)"
OBJECT = "an object"
LIST = "a list"


@dataclass(frozen=True)
class Mismatch:
    """A value at ``path`` (keys and list indices in the object) that is not ``expected``."""

    path: tuple[str | int, ...]
    expected: str
    value: Any = field(compare=False, hash=False)
    # Two mismatches are the same when path, expectation and value are (the value's text).
    shown: str = ""

    @property
    def field_path(self) -> str:
        """``spec.template.spec.nodeSelector.interrupt-gate`` (``--path`` syntax)."""
        return sub_path(self.path, first=True)


# --------------------------------------------------------------------------- type specs
# A spec is a tuple: ("model", cls), ("list", spec), ("map", spec), ("scalar", expected),
# ("crd", schema) or ("any",).

ANY: tuple[Any, ...] = ("any",)
_SCALARS = {
    "str": STRING,
    "datetime": STRING,
    "date": STRING,
    "bytes": STRING,  # base64 text in JSON (Secret data)
    "int": INTEGER,
    "float": NUMBER,
    "bool": BOOLEAN,
}


def _model(name: str) -> type[BaseModel] | None:
    cls = getattr(kubernetes.client, name, None)
    if isinstance(cls, type) and hasattr(cls, "openapi_types") and hasattr(cls, "attribute_map"):
        return cls
    return None


def _parse(type_name: str, quantity: bool) -> tuple[Any, ...]:
    """A client type string (``List[V1Container]``, ``Dict[str, str]``, ``int``) as a spec.

    Both the pydantic-era (``Dict[str, X]``) and the older (``dict(str, X)``) spellings.
    """
    t = type_name.strip()
    m = re.fullmatch(r"(?:List\[|list\[)(.*)\]", t)
    if m:
        return ("list", _parse(m.group(1), quantity))
    m = re.fullmatch(r"(?:Dict\[|dict\()\s*str\s*,\s*(.*)[\])]", t)
    if m:
        return ("map", _parse(m.group(1), quantity))
    if t in _SCALARS:
        return ("scalar", QUANTITY_TYPE if quantity else _SCALARS[t])
    cls = _model(t)
    return ("model", cls) if cls is not None else ANY


def _is_int_or_string(annotation: Any) -> bool:
    """The model's field is ``Union[StrictInt, StrictStr]`` (IntOrString), not free-form."""

    def base(a: Any) -> Any:
        return typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a

    members = {base(a) for a in typing.get_args(annotation)} - {type(None)}
    return members == {int, str}


@functools.cache
def _fields(cls: type[BaseModel]) -> dict[str, tuple[Any, ...]]:
    """JSON name -> spec of every field of ``cls``."""
    out: dict[str, tuple[Any, ...]] = {}
    for attr, type_name in cls.openapi_types.items():
        json_name = cls.attribute_map.get(attr, attr)
        if type_name == "object":  # IntOrString, or free-form (managedFields' fieldsV1)
            annotation = cls.model_fields[attr].annotation if attr in cls.model_fields else None
            out[json_name] = ("scalar", INT_OR_STRING) if _is_int_or_string(annotation) else ANY
        else:
            out[json_name] = _parse(type_name, (cls.__name__, attr) in QUANTITY_FIELDS)
    return out


def _builtin_group(group: str) -> bool:
    """The API's own groups: core (""), the legacy un-dotted ones and ``*.k8s.io``."""
    return group == "" or "." not in group or group.endswith(".k8s.io")


@functools.cache
def _crd_schemas() -> dict[str, Mapping[str, Any]]:
    from pmem_components.manifests.crd import load_crd

    return {
        v["name"]: v["schema"]["openAPIV3Schema"]
        for v in load_crd()["spec"]["versions"]
        if "schema" in v
    }


def root_spec(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """The spec of ``obj`` by its apiVersion and kind; ``("any",)`` when none is known."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str) or not kind:
        return ANY
    group, _, version = api_version.rpartition("/")
    if group == names.CRD_GROUP and kind == names.CRD_KIND:
        schema = _crd_schemas().get(version)
        return ("crd", schema) if schema is not None else ANY
    if not _builtin_group(group) or not version:
        return ANY
    cls = _model(version[:1].upper() + version[1:] + kind)
    return ("model", cls) if cls is not None else ANY


# --------------------------------------------------------------------------- the walk


def mismatches(obj: Mapping[str, Any]) -> list[Mismatch]:
    """Every value of ``obj`` whose type the API would refuse, in document order."""
    out: list[Mismatch] = []
    _walk(obj, root_spec(obj), (), out)
    return out


def _integral(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _scalar_ok(value: Any, expected: str) -> bool:
    if expected == STRING:
        return isinstance(value, str)
    if expected == INTEGER:
        return _integral(value)
    if expected == NUMBER:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected == BOOLEAN:
        return isinstance(value, bool)
    if expected == INT_OR_STRING:
        return isinstance(value, str) or _integral(value)
    if expected == QUANTITY_TYPE:
        if isinstance(value, str):
            return QUANTITY.match(value) is not None
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def _add(out: list[Mismatch], path: tuple[str | int, ...], expected: str, value: Any) -> None:
    out.append(Mismatch(path, expected, value, repr(value)[:80]))


def shape(m: Mismatch) -> tuple[Any, ...]:
    """The mismatch without its list indices: what stays when a patch shifts a list."""
    return (m.expected, m.shown, tuple("*" if isinstance(p, int) else p for p in m.path))


def _walk(
    value: Any, spec: tuple[Any, ...], path: tuple[str | int, ...], out: list[Mismatch]
) -> None:
    if value is None or spec[0] == "any":
        return
    kind = spec[0]
    if kind == "scalar":
        if not _scalar_ok(value, spec[1]):
            _add(out, path, spec[1], value)
    elif kind == "list":
        if not isinstance(value, list):
            _add(out, path, LIST, value)
            return
        for i, item in enumerate(value):
            _walk(item, spec[1], (*path, i), out)
    elif kind == "map":
        if not isinstance(value, Mapping):
            _add(out, path, OBJECT, value)
            return
        for k, item in value.items():
            _walk(item, spec[1], (*path, str(k)), out)
    elif kind == "model":
        if not isinstance(value, Mapping):
            _add(out, path, OBJECT, value)
            return
        fields = _fields(spec[1])
        for k, item in value.items():
            if k in fields:  # unknown fields: see the module doc
                _walk(item, fields[k], (*path, k), out)
    elif kind == "crd":
        _walk_schema(value, spec[1], path, out)


_SCHEMA_TYPES = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": BOOLEAN}
_OBJECT_META = ("model", _model("V1ObjectMeta"))


def _walk_schema(
    value: Any, schema: Mapping[str, Any], path: tuple[str | int, ...], out: list[Mismatch]
) -> None:
    """A structural schema (a CRD's): types only; enums and patterns are the API server's."""
    if value is None:
        return
    if path == ("metadata",):
        _walk(value, _OBJECT_META, path, out)
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not _scalar_ok(value, INT_OR_STRING):
            _add(out, path, INT_OR_STRING, value)
        return
    type_ = schema.get("type")
    if type_ in _SCHEMA_TYPES:
        if not _scalar_ok(value, _SCHEMA_TYPES[type_]):
            _add(out, path, _SCHEMA_TYPES[type_], value)
    elif type_ == "array":
        if not isinstance(value, list):
            _add(out, path, LIST, value)
            return
        items = schema.get("items")
        for i, item in enumerate(value):
            if isinstance(items, Mapping):
                _walk_schema(item, items, (*path, i), out)
    elif type_ == "object":
        if not isinstance(value, Mapping):
            _add(out, path, OBJECT, value)
            return
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for k, item in value.items():
            sub = props.get(k, extra if isinstance(extra, Mapping) else None)
            if isinstance(sub, Mapping):
                _walk_schema(item, sub, (*path, str(k)), out)


# --------------------------------------------------------------------------- messages


def describe_value(value: Any, secret: bool) -> str:
    """``the number 253578``, ``the string "3"``, ``true``; for a Secret only the type.

    Strings are JSON-escaped: a newline in one must not split the problem's line.
    """
    if isinstance(value, bool):
        return "a boolean" if secret else ("true" if value else "false")
    if isinstance(value, int | float):
        return "a number" if secret else f"the number {value}"
    if isinstance(value, str):
        return "a string" if secret else f"the string {json.dumps(value[:60])}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _parses_as(text: str, expected: str) -> bool:
    """``text`` written without quotes would be a value of the ``expected`` type."""
    t = text.strip()
    if expected == BOOLEAN:
        return t in ("true", "false")
    if expected in (INTEGER, INT_OR_STRING):
        return re.fullmatch(r"[+-]?\d+", t) is not None
    if expected == NUMBER:
        return re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", t) is not None
    return False


def fix_hint(m: Mismatch, key: str, exact: bool, secret: bool) -> str:
    """How to write the value so the API accepts it, as far as the type tells.

    ``key``: the stack-config key holding the value; ``exact`` when it is the value's own key
    (then ``pulumi config set --path`` can be given it).
    """
    given = m.value
    if m.expected in (STRING, INT_OR_STRING) and isinstance(given, int | float):
        # INT_OR_STRING: a fraction (0.5) or a boolean; as a string the API takes it.
        return string_fix(key, given, exact=exact, secret=secret)
    if isinstance(given, str) and _parses_as(given, m.expected):
        return (
            "write it without quotes in Pulumi.<stack>.yaml (pulumi config set --path stores "
            "digits as a number and true/false as a boolean)"
        )
    return ""


def config_secret(key: str) -> bool:
    """``key`` (``pmem-csi:deployments[0]...``) lies in a secret stack-config value.

    Pulumi marks a whole top-level key secret when any part of it is (``config set --secret
    --path``); the program then knows only that, so every value under it is treated as secret.
    """
    top = re.match(r"[^.\[]+", key)
    return top is not None and pulumi_config.is_config_secret(top.group(0))


def problem(src: Source, what: str, m: Mismatch, secret: bool) -> str:
    """One line: ``<key>: must be a string, not the number 3 (<what>, field <path>); <fix>``."""
    secret = secret or config_secret(src.key)
    line = (
        f"{src.key}: must be {m.expected}, not {describe_value(m.value, secret)} "
        f"({what}, field {m.field_path})"
    )
    hint = src.note or fix_hint(m, src.key, src.exact, secret)
    return f"{line}; {hint}" if hint else line


def object_ref(obj: Mapping[str, Any]) -> str:
    """``StatefulSet pmem-csi/pmem-csi-intel-com-controller``."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"


def pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _walk_value(node: Any, rest: Sequence[str | int]) -> tuple[list[str | int], Any]:
    """The longest prefix of ``rest`` present in ``node``."""
    walked: list[str | int] = []
    for part in rest:
        in_map = isinstance(node, Mapping) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_map or in_list):
            break
        node = node[part]
        walked.append(part)
    return walked, node


@dataclass(frozen=True)
class Source:
    """Where a wrong value was written: the stack-config ``key`` (``exact`` when it is the
    value's own key, so ``pulumi config set --path`` can be given it) and a ``note`` that
    replaces the fix hint (a copied value is not in the YAML; its source is)."""

    key: str
    exact: bool
    note: str = ""


def merge_source(label: str, merge: Mapping[str, Any], path: tuple[str | int, ...]) -> Source:
    """A merge patch holds the value at the same path (it replaces lists whole, so even list
    indices agree); ``exact`` is False when only a part of the path is found."""
    walked, _ = _walk_value(merge, path)
    return Source(f"{label}.mergePatch{sub_path(walked)}", len(walked) == len(path))


def op_source(
    label: str, k: int, op: Mapping[str, Any], path: tuple[str | int, ...]
) -> Source | None:
    """The key in operation ``k`` (which wrote the value at ``path``, in the object right
    after it); None when the operation's path does not cover ``path``."""
    parts = pointer(str(op.get("path", "")))
    # "-" (append) is the index the item got: any index, as this one operation wrote it.
    if len(parts) > len(path) or not all(
        p == str(q) or (p == "-" and isinstance(q, int))
        for p, q in zip(parts, path, strict=False)
    ):
        return None
    kind = op.get("op")
    if kind in ("copy", "move"):
        verb = "copied" if kind == "copy" else "moved"
        return Source(f"{label}.jsonPatch[{k}]", False, f"{verb} from {op.get('from')}")
    if kind not in ("add", "replace"):
        return None
    rest = path[len(parts) :]
    walked, _ = _walk_value(op.get("value"), rest)
    return Source(f"{label}.jsonPatch[{k}].value{sub_path(walked)}", len(walked) == len(rest))
