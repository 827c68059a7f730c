"""Which cluster: the Kubernetes provider's answer, for every request the program sends itself.

Why this module: besides the Kubernetes provider, the program talks to the cluster itself (the
preflight reads it, the field take-over writes ``managedFields`` and applies). Those requests
must go where the provider's go. The provider (pulumi-kubernetes 4.25, ``Configure``) decides
with client-go, and the Python client's own loader decides differently in several ways (with
several ``KUBECONFIG`` files the last file's ``current-context`` wins there, an empty file
fails, content is told from a path by its first characters, ``kubernetes:cluster`` is not
known, there is no in-cluster fallback). So this module re-states the provider's rules, and
the program builds its client only from what :func:`resolve` returns:

* ``renderYamlToDirectory`` set: the provider writes files and sends no request; neither does
  the program (:attr:`Target.kind` ``"render"``).
* ``kubeconfig`` set (and not empty): an existing file at that path (``~`` expanded) is read,
  anything else is taken as kubeconfig content (YAML or JSON, any form). Paths inside it are
  used as written, relative to the working directory (the provider does not resolve them
  against the file's directory). No in-cluster fallback.
* otherwise client-go's loading rules: ``KUBECONFIG`` as a ``:``-separated list (duplicates
  dropped, empty and missing files skipped, an unreadable or invalid one an error), or
  ``~/.kube/config`` when ``KUBECONFIG`` is unset or empty. For each cluster, context and user
  name the first file that defines it wins, and so does the first non-empty
  ``current-context``; relative paths in a file are resolved against that file's directory.
  When that yields no configuration at all, in-cluster ServiceAccount credentials are used
  if the process runs in a pod (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the token file).
* then ``context`` replaces ``current-context`` (it must exist) and ``cluster`` replaces the
  context's cluster.

Pure apart from reading the kubeconfig files and checking for the token file: settings and
environment in, :class:`Target` out. Table tests compare it with the locally built kubectl
(tests/unit/test_kubetarget.py).
"""

from __future__ import annotations

import base64
import copy
import datetime
import importlib.util
import ipaddress
import os
import pwd
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The stack config keys the default provider reads (namespace "kubernetes").
SETTING_KEYS = ("kubeconfig", "context", "cluster", "renderYamlToDirectory")


class TargetError(ValueError):
    """The settings name no usable cluster; the message names the setting."""


@dataclass(frozen=True)
class ProviderSettings:
    """A Kubernetes provider's cluster settings: the default provider's from the stack config
    (``kubernetes:kubeconfig`` ...), or an explicit ``kubernetes.Provider``'s arguments.

    ``origin`` names where they come from in messages: ``kubernetes:`` (stack config keys
    ``kubernetes:<name>``) or, e.g., ``provider east`` (its argument ``<name>``).
    """

    kubeconfig: str | None = None
    context: str | None = None
    cluster: str | None = None
    render_yaml_to_directory: str | None = None
    origin: str = "kubernetes:"

    def key(self, name: str) -> str:
        """The setting ``name`` as the user sets it (``kubernetes:context``, ``provider east
        argument context``)."""
        if self.origin == "kubernetes:":
            return f"kubernetes:{name}"
        return f"{self.origin} argument {name}"

    @classmethod
    def from_stack_config(cls, get: Any) -> ProviderSettings:
        """The default provider's settings; ``get(key)`` returns a stack config value or None."""
        values = {k: get(f"kubernetes:{k}") for k in SETTING_KEYS}
        return cls(
            kubeconfig=values["kubeconfig"],
            context=values["context"],
            cluster=values["cluster"],
            render_yaml_to_directory=values["renderYamlToDirectory"],
        )


@dataclass(frozen=True)
class Environment:
    """What of the process environment the provider's rules read."""

    kubeconfig: str | None = None  # $KUBECONFIG
    home: str = ""  # $HOME, and nothing else: client-go's homedir.HomeDir on Linux
    # The passwd entry's home: what the provider's ``~`` in ``kubernetes:kubeconfig`` means
    # (Go's user.Current().HomeDir), which is not $HOME.
    user_home: str = ""
    # HTTPS_PROXY, HTTP_PROXY, NO_PROXY (either case), REQUEST_METHOD: Go's proxy rules.
    proxy_env: Mapping[str, str] = field(default_factory=dict)
    service_host: str | None = None  # $KUBERNETES_SERVICE_HOST
    service_port: str | None = None  # $KUBERNETES_SERVICE_PORT
    service_account_dir: Path = SERVICE_ACCOUNT_DIR

    @classmethod
    def current(cls) -> Environment:
        env = os.environ
        return cls(
            kubeconfig=env.get("KUBECONFIG"),
            # Not Path.home(): that falls back to the passwd entry when HOME is unset or
            # empty, where client-go reads the relative path .kube/config.
            home=env.get("HOME", ""),
            user_home=_passwd_home(env.get("HOME", "")),
            proxy_env={k: v for k, v in env.items() if k in _PROXY_VARS},
            service_host=env.get("KUBERNETES_SERVICE_HOST"),
            service_port=env.get("KUBERNETES_SERVICE_PORT"),
            service_account_dir=SERVICE_ACCOUNT_DIR,  # read now: tests point it elsewhere
        )

    def in_cluster_possible(self) -> bool:
        """client-go's test: service host and port set, and the token file is a file."""
        token = self.service_account_dir / "token"
        return bool(self.service_host) and bool(self.service_port) and token.is_file()


_PROXY_VARS = frozenset(
    {
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "REQUEST_METHOD",
    }
)


def _passwd_home(fallback: str) -> str:
    """Go's ``user.Current().HomeDir``: the passwd entry's home, else ``$HOME``."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return fallback


@dataclass(frozen=True)
class Target:
    """The cluster requests go to, and how to authenticate there.

    ``kind``: ``"kubeconfig"`` (``config`` holds a minified kubeconfig: exactly the one
    context, cluster and user used, ``current-context`` set, file paths absolute where
    client-go makes them so), ``"in-cluster"`` (``service_account_dir`` holds token and CA) or
    ``"render"`` (no requests at all; ``server`` is empty).
    """

    kind: str
    server: str
    description: str
    context: str = ""
    cluster: str = ""
    config: Mapping[str, Any] | None = None
    service_account_dir: Path = SERVICE_ACCOUNT_DIR
    render_directory: str = ""
    # The proxy requests to ``server`` go through (None: direct), as client-go decides it:
    # the cluster's proxy-url, else Go's ProxyFromEnvironment (:func:`go_proxy`).
    proxy: str | None = None

    @property
    def makes_requests(self) -> bool:
        return self.kind != "render"


@dataclass
class _Config:
    """A kubeconfig as client-go holds it: maps by name, plus the current context."""

    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    current_context: str = ""


_LISTS = (("clusters", "cluster"), ("contexts", "context"), ("users", "user"))


# The kubeconfig v1 schema, as far as client-go's decoder checks value types (unknown keys
# are ignored there too): "s" string, "b" bool, "d" base64 bytes, "*" anything,
# ("list", item), ("map", value), or a dict of fields.
_EXTENSIONS: Any = ("list", {"name": "s", "extension": "*"})
_SCHEMA: dict[str, Any] = {
    "apiVersion": "s",
    "kind": "s",
    "current-context": "s",
    "preferences": {"colors": "b", "extensions": _EXTENSIONS},
    "extensions": _EXTENSIONS,
    "clusters": (
        "list",
        {
            "name": "s",
            "cluster": {
                "server": "s",
                "tls-server-name": "s",
                "insecure-skip-tls-verify": "b",
                "certificate-authority": "s",
                "certificate-authority-data": "d",
                "proxy-url": "s",
                "disable-compression": "b",
                "extensions": _EXTENSIONS,
            },
        },
    ),
    "contexts": (
        "list",
        {
            "name": "s",
            "context": {
                "cluster": "s",
                "user": "s",
                "namespace": "s",
                "extensions": _EXTENSIONS,
            },
        },
    ),
    "users": (
        "list",
        {
            "name": "s",
            "user": {
                "client-certificate": "s",
                "client-certificate-data": "d",
                "client-key": "s",
                "client-key-data": "d",
                "token": "s",
                "tokenFile": "s",
                "as": "s",
                "as-uid": "s",
                "as-groups": ("list", "s"),
                "as-user-extra": ("map", ("list", "s")),
                "username": "s",
                "password": "s",
                "auth-provider": {"name": "s", "config": ("map", "s")},
                "exec": {
                    "command": "s",
                    "args": ("list", "s"),
                    "env": ("list", {"name": "s", "value": "s"}),
                    "apiVersion": "s",
                    "installHint": "s",
                    "provideClusterInfo": "b",
                    "interactiveMode": "s",
                },
                "extensions": _EXTENSIONS,
            },
        },
    ),
}


def _type_problem(value: Any, schema: Any, path: str) -> str | None:
    """The first value of a type client-go's decoder refuses (it fails the whole file)."""
    if value is None or schema == "*":
        return None  # null is the zero value
    if schema == "s":
        ok = isinstance(value, str | datetime.date)  # a YAML timestamp is a string to Go
        return None if ok else f"{path} must be a string, not {_yaml_type(value)}"
    if schema == "b":
        return None if isinstance(value, bool) else f"{path} must be true or false"
    if schema == "d":
        try:
            base64.b64decode(re.sub(r"[\r\n]", "", str(value)), validate=True)
            return None if isinstance(value, str) else f"{path} must be base64 text"
        except ValueError:
            return f"{path} is not valid base64"
    if isinstance(schema, dict):
        if not isinstance(value, Mapping):
            return f"{path} must be a mapping, not {_yaml_type(value)}"
        for key, sub in schema.items():
            problem = _type_problem(value.get(key), sub, f"{path}.{key}" if path else key)
            if problem:
                return problem
        return None
    kind, item = schema
    if kind == "list":
        if not isinstance(value, list):
            return f"{path} must be a list, not {_yaml_type(value)}"
        pairs = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        if not isinstance(value, Mapping):
            return f"{path} must be a mapping, not {_yaml_type(value)}"
        pairs = [(f"{path}.{k}", v) for k, v in value.items()]
    return next((p for w, v in pairs if (p := _type_problem(v, item, w))), None)


def _yaml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {list: "a list", str: "a string"}.get(type(value), "a mapping")


_TAG = "tag:yaml.org,2002:"
# go-yaml v2's resolve table (resolve.go), which sigs.k8s.io/yaml uses: the plain scalars it
# looks up by their text. "<<" is a merge key only as a key (a value "<<" is that string).
_GO_WORDS: dict[str, str] = {
    **dict.fromkeys(
        ["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"], "bool"
    ),
    **dict.fromkeys(
        ["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"], "bool"
    ),
    **dict.fromkeys(["", "~", "null", "Null", "NULL"], "null"),
    **dict.fromkeys(
        [f"{sign}.{word}" for sign in ("", "+", "-") for word in ("inf", "Inf", "INF")]
        + [".nan", ".NaN", ".NAN"],
        "float",
    ),
}
# Go's strconv.ParseInt/ParseUint(text, 0, 64) after go-yaml removed every "_".
_GO_INT = re.compile(r"[-+]?(?:0[bB][01]+|0[oO][0-7]+|0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_GO_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_GO_DOT_FLOAT = re.compile(r"\.[0-9]+(?:[eE][-+]?[0-9]+)?")


def _go_int(text: str) -> int | None:
    """The value of ``text`` as go-yaml v2 reads an integer (None: not one in 64 bits)."""
    plain = text.replace("_", "")
    if not _GO_INT.fullmatch(plain):
        return None
    digits = plain.lstrip("+-")
    base = 8 if digits[:1] == "0" and digits[1:2].isdigit() else 0  # Go's leading-0 octal
    value = int(digits, base) * (-1 if plain.startswith("-") else 1)
    signed = -(2**63) <= value < 2**63
    return value if signed or (plain[0] not in "+-" and 0 <= value < 2**64) else None


def _go_scalar_tag(value: str) -> str:
    """The tag go-yaml v2 resolves a plain scalar to (its ``resolve``): not YAML 1.1's as
    PyYAML has it -- no sexagesimal numbers (``1:20``), no ``=`` value key, timestamps are
    kept as their text, ``y``/``n`` are booleans, and numbers are what Go's strconv reads
    (``0o17``, ``1_000``, ``1e3``)."""
    if value in _GO_WORDS:
        return _TAG + _GO_WORDS[value]
    if value == "<<":
        return _TAG + "merge"
    if value[:1] == ".":
        return _TAG + ("float" if _GO_DOT_FLOAT.fullmatch(value) else "str")
    if value[:1] not in tuple("+-0123456789"):
        return _TAG + "str"
    if _go_int(value) is not None:
        return _TAG + "int"
    plain = value.replace("_", "")
    if _GO_FLOAT.fullmatch(plain) and float(plain) not in (float("inf"), float("-inf")):
        return _TAG + "float"
    return _TAG + "str"


_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _GoLoader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader (libyaml's parser where it is built) with go-yaml v2's typing of
    plain scalars (:func:`_go_scalar_tag`), so a value's type is the one client-go sees."""

    bool_values: ClassVar[dict[str, bool]] = {
        **yaml.SafeLoader.bool_values,
        "y": True,
        "n": False,
    }

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return _go_scalar_tag(value)
        return str(super().resolve(kind, value, implicit))

    def construct_yaml_int(self, node: Any) -> int:
        value = _go_int(str(self.construct_scalar(node)))
        return 0 if value is None else value

    def construct_yaml_float(self, node: Any) -> float:
        text = str(self.construct_scalar(node)).replace("_", "").lower()
        return float(text.replace(".", "") if text.lstrip("+-") in (".inf", ".nan") else text)


_GoLoader.add_constructor(_TAG + "int", _GoLoader.construct_yaml_int)
_GoLoader.add_constructor(_TAG + "float", _GoLoader.construct_yaml_float)
# A plain "<<" in a value (not a key): go-yaml v2 reads the string.
_GoLoader.add_constructor(_TAG + "merge", lambda loader, node: loader.construct_scalar(node))


def _first_document(data: bytes, where: str) -> Any:
    """The first YAML document of ``data``, as sigs.k8s.io/yaml reads it (a port of libyaml:
    later documents are not even parsed, a leading BOM is skipped, tabs separate tokens
    inside JSON's braces); PyYAML's libyaml binding where it is built, which parses alike,
    with go-yaml v2's scalar types (:class:`_GoLoader`)."""
    loader = _GoLoader(data)
    try:
        return loader.get_data() if loader.check_data() else None
    except yaml.YAMLError as err:
        raise TargetError(f"{where}: not valid YAML or JSON ({str(err).splitlines()[0]})") from None
    finally:
        loader.dispose()


def parse(text: str | bytes, where: str) -> _Config:
    """A kubeconfig's text (YAML or JSON) as :class:`_Config`, as client-go's
    ``clientcmd.Load`` reads it: empty text is an empty config, only the first YAML document
    counts, ``apiVersion``/``kind`` must be ``v1``/``Config`` (or unset), a value of the wrong
    type fails the whole text.

    Raises :class:`TargetError` naming ``where`` for text that is not a kubeconfig.
    """
    data = text.encode() if isinstance(text, str) else text
    if not data.strip():
        return _Config()
    doc = _first_document(data, where)
    if doc is None:
        return _Config()
    if not isinstance(doc, Mapping):
        raise TargetError(f"{where}: not a kubeconfig (a {type(doc).__name__}, not a mapping)")
    version, kind = doc.get("apiVersion") or "v1", doc.get("kind") or "Config"
    if (version, kind) != ("v1", "Config"):
        raise TargetError(
            f"{where}: not a kubeconfig (apiVersion {version!r}, kind {kind!r}; a kubeconfig "
            "has apiVersion v1 and kind Config)"
        )
    problem = _type_problem(doc, _SCHEMA, "")
    if problem:
        raise TargetError(f"{where}: {problem}")
    out = _Config(current_context=_text(doc.get("current-context")))
    for key, inner in _LISTS:
        target: dict[str, dict[str, Any]] = getattr(out, key)
        for entry in doc.get(key) or []:
            entry = entry or {}
            name = _text(entry.get("name"))  # a missing name is "" to client-go
            if name in target:  # client-go refuses duplicates within one file
                raise TargetError(f"{where}: duplicate name {name!r} in {key}")
            target[name] = copy.deepcopy(dict(entry.get(inner) or {}))
    return out


def _text(value: Any) -> str:
    """A string field's value: null is empty, a YAML timestamp its ISO text."""
    if value is None:
        return ""
    return value.isoformat() if isinstance(value, datetime.date) else str(value)


def _resolve_paths(config: _Config, base: Path) -> None:
    """client-go's ResolveLocalPaths for one file: its relative file references become
    absolute against its directory (exec commands only when they contain a ``/``)."""

    def fix(obj: dict[str, Any], key: str) -> None:
        value = obj.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            obj[key] = str(base / value)

    for cluster in config.clusters.values():
        fix(cluster, "certificate-authority")
    for user in config.users.values():
        for key in ("client-certificate", "client-key", "tokenFile"):
            fix(user, key)
        exec_ = user.get("exec")
        if isinstance(exec_, dict) and "/" in str(exec_.get("command") or ""):
            fix(exec_, "command")


def kubeconfig_files(env: Environment) -> list[str]:
    """client-go's precedence list: ``KUBECONFIG`` split and deduplicated, else the home file.

    ``~`` is not expanded in either: client-go takes ``KUBECONFIG`` entries as written, and the
    home file is ``$HOME/.kube/config`` with ``$HOME`` as set (unset or empty: the relative
    path ``.kube/config``, as Go's ``filepath.Join("", ".kube", "config")``)."""
    if env.kubeconfig:
        files = [f for f in env.kubeconfig.split(os.pathsep) if f]
        return list(dict.fromkeys(files))
    return [home_file(env)]


def home_file(env: Environment) -> str:
    """client-go's RecommendedHomeFile."""
    return os.path.join(env.home, ".kube", "config")


def _migrated(name: str, env: Environment | None) -> Path:
    """client-go's migration rule: a missing home file is first copied from the old
    ``$HOME/.kube/.kubeconfig``, so that file is what the provider reads then."""
    path = Path(name)
    if env is None or name != home_file(env) or path.exists():
        return path
    old = Path(os.path.join(env.home, ".kube", ".kubeconfig"))
    return old if old.is_file() else path


def load_files(files: list[str], env: Environment | None = None) -> _Config:
    """Merge kubeconfig files as client-go does: per name the first file wins, and the first
    non-empty ``current-context``; missing files are skipped, unreadable ones an error."""
    merged = _Config()
    for name in files:
        path = _migrated(name, env)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise TargetError(f"KUBECONFIG: cannot read {name} ({err.strerror})") from None
        config = parse(text, f"KUBECONFIG file {name}")
        _resolve_paths(config, Path(os.path.abspath(name)).parent)
        for key, _ in _LISTS:
            into: dict[str, dict[str, Any]] = getattr(merged, key)
            for entry, value in getattr(config, key).items():
                into.setdefault(entry, value)
        merged.current_context = merged.current_context or config.current_context
    return merged


def _load_setting(value: str, settings: ProviderSettings, env: Environment) -> tuple[_Config, str]:
    """``kubeconfig`` as the provider reads it: an existing path's file, else content.

    ``~`` and ``~/`` stand for the passwd entry's home, as the provider expands them
    (``user.Current().HomeDir``), not for ``$HOME``."""
    path = value
    if path == "~":
        path = env.user_home
    elif path.startswith("~/"):
        path = os.path.join(env.user_home, path[2:])
    try:
        os.stat(path)
        is_path = True
    except (OSError, ValueError):
        is_path = False
    key = settings.key("kubeconfig")
    if is_path:
        try:
            text = Path(path).read_bytes()
        except OSError as err:
            raise TargetError(f"{key}: cannot read {path} ({err.strerror})") from None
        return parse(text, f"{key} (file {path})"), f"{key} file {path}"
    return parse(value, f"{key} (neither an existing file nor kubeconfig content)"), (
        f"{key} (content)"
    )


def _in_cluster(env: Environment, why: str) -> Target:
    host = env.service_host or ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address, as net.JoinHostPort writes it
    return Target(
        kind="in-cluster",
        server=f"https://{host}:{env.service_port}",
        description=f"in-cluster ServiceAccount credentials ({why})",
        service_account_dir=env.service_account_dir,
        proxy=go_proxy(f"https://{host}:{env.service_port}", env.proxy_env),
    )


def resolve(settings: ProviderSettings, env: Environment | None = None) -> Target:
    """The cluster the provider with ``settings`` sends its requests to (see the module doc).

    Raises :class:`TargetError` when the provider would find no usable cluster either; the
    message names the setting to change.
    """
    env = env or Environment.current()
    if settings.render_yaml_to_directory:
        return Target(
            kind="render",
            server="",
            description=(
                f"{settings.key('renderYamlToDirectory')} {settings.render_yaml_to_directory}:"
                " manifests are written to files, no cluster is contacted"
            ),
            render_directory=settings.render_yaml_to_directory,
        )
    if settings.kubeconfig:
        config, source = _load_setting(settings.kubeconfig, settings, env)
        deferred = False
    else:
        files = kubeconfig_files(env)
        config = load_files(files, env)
        source = f"KUBECONFIG ({', '.join(files)})" if env.kubeconfig else f"kubeconfig {files[0]}"
        deferred = True
    return _select(config, settings, env, source, deferred)


def _select(
    config: _Config, settings: ProviderSettings, env: Environment, source: str, deferred: bool
) -> Target:
    """Context, cluster and user as client-go's DirectClientConfig picks them."""
    context_name = settings.context or config.current_context
    if context_name and context_name not in config.contexts:
        key = settings.key("context") if settings.context else "current-context"
        raise TargetError(f"{key}: context {context_name!r} is not defined in {source}")
    context = config.contexts.get(context_name, {})
    cluster_name = settings.cluster or str(context.get("cluster") or "")
    cluster = config.clusters.get(cluster_name)
    if cluster is None:
        # client-go: no cluster at all is "no configuration", which in-cluster credentials
        # answer when the loading rules were used (not for an explicit kubeconfig).
        if deferred and env.in_cluster_possible():
            return _in_cluster(env, f"{source} names no cluster")
        if settings.cluster:
            raise TargetError(
                f"{settings.key('cluster')}: cluster {settings.cluster!r} is not defined in "
                f"{source}"
            )
        raise TargetError(
            f"no cluster configured: {source} names none (set {settings.key('kubeconfig')} "
            f"or {settings.key('context')}, or KUBECONFIG)"
        )
    server = str(cluster.get("server") or "")
    if not server:
        raise TargetError(f"{source}: cluster {cluster_name!r} has no server")
    user_name = str(context.get("user") or "")
    user = config.users.get(user_name, {})
    ctx_name = context_name or "pmem-csi-target"
    minified = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": copy.deepcopy(cluster)}],
        "users": [{"name": user_name or "pmem-csi-anonymous", "user": copy.deepcopy(user)}],
        "contexts": [
            {
                "name": ctx_name,
                "context": {"cluster": cluster_name, "user": user_name or "pmem-csi-anonymous"},
            }
        ],
        "current-context": ctx_name,
    }
    how = []
    if context_name:
        how.append(f"context {context_name}")
    how.append(f"cluster {cluster_name}")
    return Target(
        kind="kubeconfig",
        server=server,
        description=f"{source}, {', '.join(how)} ({server})",
        context=context_name,
        cluster=cluster_name,
        config=minified,
        proxy=_cluster_proxy(cluster, cluster_name, source) or go_proxy(server, env.proxy_env),
    )


def _cluster_proxy(cluster: Mapping[str, Any], name: str, source: str) -> str | None:
    """The cluster's ``proxy-url``: client-go sends every request through it (NO_PROXY does
    not apply), and accepts only http, https and socks5 proxies."""
    value = str(cluster.get("proxy-url") or "")
    if not value:
        return None
    if urlsplit(value).scheme not in ("http", "https", "socks5"):
        raise TargetError(
            f"{source}: cluster {name!r} proxy-url {shown_url(value)}: the scheme must be "
            "http, https or socks5"
        )
    return value


def shown_url(url: str) -> str:
    """A proxy URL as messages show it: scheme and host only (its ``user:password@``, path
    and query are not printed; client-go's messages name the scheme)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(not shown: not a URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}"


def proxy_settings(proxy: str | None) -> tuple[str | None, dict[str, str] | None]:
    """The Python client's ``proxy`` and ``proxy_headers`` for the proxy client-go uses.

    Go's transport sends a proxy URL's userinfo as ``Proxy-Authorization: Basic`` (decoded);
    urllib3's ProxyManager ignores userinfo, so it becomes that header and leaves the URL.
    A socks5 proxy gets the host name to resolve, as Go's socks5 dialer sends it: urllib3's
    ``socks5h`` (whose SOCKSProxyManager takes the login from the URL itself)."""
    if not proxy:
        return None, None
    parts = urlsplit(proxy)
    if parts.scheme == "socks5":
        return parts._replace(scheme="socks5h").geturl(), None
    if parts.username is None and parts.password is None:
        return proxy, None
    import urllib3

    login = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    netloc = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=netloc).geturl(), urllib3.make_headers(proxy_basic_auth=login)


def go_proxy(server: str, environ: Mapping[str, str]) -> str | None:
    """Go's ``http.ProxyFromEnvironment`` (golang.org/x/net/http/httpproxy), which client-go
    uses when the cluster names no proxy-url: the upper-case variable before the lower-case
    one, HTTPS_PROXY for an https server and HTTP_PROXY for http only (no ALL_PROXY), never
    for localhost or a loopback address, and NO_PROXY's hosts, domains, IPs and CIDRs.

    The Python client's own rules differ in each of these points, so its result is not used.
    """

    def first(*names: str) -> str:
        return next((environ[n] for n in names if environ.get(n)), "")

    url = urlsplit(server)
    if url.scheme == "https":
        proxy = first("HTTPS_PROXY", "https_proxy")
    elif url.scheme == "http":
        proxy = first("HTTP_PROXY", "http_proxy")
        if proxy and environ.get("REQUEST_METHOD"):
            raise TargetError(
                "HTTP_PROXY: Go refuses it in a CGI environment (REQUEST_METHOD is set), and "
                "so does the provider's client; unset one of them"
            )
    else:
        proxy = ""
    if not proxy:
        return None
    parsed = urlsplit(proxy)
    if not parsed.scheme or not parsed.netloc:
        proxy = f"http://{proxy}"  # Go's parseProxy: a bare host:port is an http proxy
    host = (url.hostname or "").lower()
    port = str(url.port or (443 if url.scheme == "https" else 80))
    return proxy if _use_proxy(host, port, first("NO_PROXY", "no_proxy")) else None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _use_proxy(host: str, port: str, no_proxy: str) -> bool:
    """httpproxy's useProxy: whether a request to ``host:port`` goes through the proxy."""
    ip = _ip(host)
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return False
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return False
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                network = None
            if network is not None:
                if ip is not None and ip.version == network.version and ip in network:
                    return False
                continue
        phost, pport = entry, ""
        bracketed = re.fullmatch(r"\[([^\]]*)\]:(\d*)", entry)
        if bracketed:
            phost, pport = bracketed.groups()
        elif entry.count(":") == 1:
            phost, pport = entry.split(":")
        if not phost:
            continue
        pip = _ip(phost)
        if pip is not None:
            if ip is not None and ip == pip and pport in ("", port):
                return False
            continue
        if phost.startswith("*."):
            phost = phost[1:]
        match_host = not phost.startswith(".")
        if match_host:
            phost = "." + phost
        if (host.endswith(phost) or (match_host and host == phost[1:])) and pport in ("", port):
            return False
    return True


# What must not reach a message: header values (http.client names a refused one whole:
# ``Invalid header value b'Bearer <token>\\n'``), credentials after an auth scheme or an
# Authorization header name, and the userinfo (``user:password@``) of a URL.
_SECRETS = (
    (re.compile(r"(Invalid header (?:value|name)) b?(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"),
     r"\1 (not shown; a token or password with a line break in it?)"),
    (re.compile(r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)[^'\",}\r\n]*"),
     r"\1(not shown)"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 (not shown)"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s'\"]*@"), r"\1"),
)  # fmt: skip


def redact(text: str) -> str:
    """``text`` (a request exception's) without header values, credentials or URL
    passwords: the messages it goes into are printed and logged."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def error_text(err: BaseException, limit: int = 200) -> str:
    """A request failure as messages name it: its type and its redacted text, cut short."""
    return f"{type(err).__name__}: {redact(str(err))[:limit]}"


def api_client(target: Target) -> Any:
    """A Kubernetes API client (the official Python client) for ``target``.

    Built from the minified kubeconfig only, so the Python client's own rules never choose;
    where they differ from client-go's in how a request is sent, client-go's are applied on
    top: the proxy (:attr:`Target.proxy`) and a ``tokenFile`` (:func:`_token_hook`).
    """
    if not target.makes_requests:
        raise TargetError(f"{target.description}: no requests are sent")
    if (target.proxy or "").startswith("socks") and importlib.util.find_spec("socks") is None:
        raise TargetError(
            f"{target.description}: the proxy {shown_url(target.proxy or '')} is a SOCKS proxy, "
            "which the program's own client reaches only with the Python package PySocks "
            "(not installed); install it, or set pmem-csi:preflight: false and "
            "pmem-csi:takeOverFields: false so that only the provider sends requests"
        )
    from kubernetes import client
    from kubernetes import config as kconfig
    from kubernetes.config import incluster_config

    configuration = client.Configuration()
    if target.kind == "in-cluster":
        host, _, port = target.server.removeprefix("https://").rpartition(":")
        incluster_config.InClusterConfigLoader(
            token_filename=str(target.service_account_dir / "token"),
            cert_filename=str(target.service_account_dir / "ca.crt"),
            environ={
                incluster_config.SERVICE_HOST_ENV_NAME: host.strip("[]"),
                incluster_config.SERVICE_PORT_ENV_NAME: port,
            },
        ).load_and_set(configuration)
    else:
        config = copy.deepcopy(dict(target.config or {}))
        user = config["users"][0]["user"]
        hook = _token_hook(user) if user.get("tokenFile") else None
        kconfig.load_kube_config_from_dict(config, client_configuration=configuration)
        if hook is not None:
            configuration.refresh_api_key_hook = hook
            hook(configuration)
    # Also: no environment proxy any more.
    configuration.proxy, configuration.proxy_headers = proxy_settings(target.proxy)
    configuration.no_proxy = None
    return client.ApiClient(configuration)


def _token_hook(user: dict[str, Any]) -> Any:
    """client-go's bearer token when the user names a ``tokenFile``: the file's content,
    trimmed and read again for every request (a rotated ServiceAccount token). When a later
    read fails (the file gone, empty, unreadable) the last token read is sent, as client-go's
    cachingTokenSource keeps it; a ``token`` given as well is sent only while the file has
    never been readable. (The Python client prefers ``token`` and reads the file once,
    untrimmed.) client-go reads the file at most once a minute; reading it for every request
    sends a rotated token sooner and is otherwise the same.

    Rewrites ``user`` for the Python client's loader (``token`` only) and returns the hook
    that sets the header from then on.
    """
    path = str(user.pop("tokenFile"))
    static = str(user.get("token") or "")
    last = {"token": ""}  # the last good read: client-go's cached token

    def read() -> str:
        try:
            token = Path(path).read_text().strip()
        except OSError:
            return ""
        if token:
            last["token"] = token
        return token

    if not static and not read():
        # client-go: with no token to fall back on, an unreadable or empty file is an error.
        try:
            Path(path).read_text()
            why = "it is empty"
        except OSError as err:
            why = f"cannot read it ({err.strerror})"
        raise TargetError(f"user tokenFile {path}: {why}") from None
    user["token"] = last["token"] or static

    def refresh(configuration: Any) -> None:
        token = read() or last["token"] or static
        configuration.api_key["BearerToken"] = f"Bearer {token}"

    return refresh
