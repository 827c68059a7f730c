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

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    home: str = ""
    service_host: str | None = None  # $KUBERNETES_SERVICE_HOST
    service_port: str | None = None  # $KUBERNETES_SERVICE_PORT
    service_account_dir: Path = SERVICE_ACCOUNT_DIR

    @classmethod
    def current(cls) -> Environment:
        env = os.environ
        return cls(
            kubeconfig=env.get("KUBECONFIG"),
            home=env.get("HOME") or str(Path.home()),
            service_host=env.get("KUBERNETES_SERVICE_HOST"),
            service_port=env.get("KUBERNETES_SERVICE_PORT"),
            service_account_dir=SERVICE_ACCOUNT_DIR,  # read now: tests point it elsewhere
        )

    def in_cluster_possible(self) -> bool:
        """client-go's test: service host and port set, and the token file is a file."""
        token = self.service_account_dir / "token"
        return bool(self.service_host) and bool(self.service_port) and token.is_file()


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


def parse(text: str, where: str) -> _Config:
    """A kubeconfig's text (YAML or JSON) as :class:`_Config`; empty text is an empty config.

    Raises :class:`TargetError` naming ``where`` for text that is not a kubeconfig.
    """
    if not text.strip():
        return _Config()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TargetError(f"{where}: not valid YAML or JSON ({str(err).splitlines()[0]})") from None
    if doc is None:
        return _Config()
    if not isinstance(doc, Mapping):
        raise TargetError(f"{where}: not a kubeconfig (a {type(doc).__name__}, not a mapping)")
    out = _Config(current_context=str(doc.get("current-context") or ""))
    for key, inner in _LISTS:
        entries = doc.get(key) or []
        if not isinstance(entries, list):
            raise TargetError(f"{where}: {key} must be a list")
        target: dict[str, dict[str, Any]] = getattr(out, key)
        for entry in entries:
            if not isinstance(entry, Mapping) or not entry.get("name"):
                raise TargetError(f"{where}: every entry of {key} needs a name")
            name = str(entry["name"])
            if name in target:  # client-go refuses duplicates within one file
                raise TargetError(f"{where}: duplicate name {name!r} in {key}")
            value = entry.get(inner) or {}
            if not isinstance(value, Mapping):
                raise TargetError(f"{where}: {key}[{name}].{inner} must be a mapping")
            target[name] = copy.deepcopy(dict(value))
    return out


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
    """client-go's precedence list: ``KUBECONFIG`` split and deduplicated, else the home file."""
    if env.kubeconfig:
        files = [f for f in env.kubeconfig.split(os.pathsep) if f]
        return list(dict.fromkeys(files))
    return [str(Path(env.home) / ".kube" / "config")]


def load_files(files: list[str]) -> _Config:
    """Merge kubeconfig files as client-go does: per name the first file wins, and the first
    non-empty ``current-context``; missing files are skipped, unreadable ones an error."""
    merged = _Config()
    for name in files:
        path = Path(name)
        try:
            text = path.read_text()
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


def _load_setting(value: str, settings: ProviderSettings) -> tuple[_Config, str]:
    """``kubeconfig`` as the provider reads it: an existing path's file, else content."""
    path = value
    if path == "~":
        path = str(Path.home())
    elif path.startswith("~/"):
        path = str(Path.home() / path[2:])
    try:
        os.stat(path)
        is_path = True
    except (OSError, ValueError):
        is_path = False
    key = settings.key("kubeconfig")
    if is_path:
        try:
            text = Path(path).read_text()
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
        config, source = _load_setting(settings.kubeconfig, settings)
        deferred = False
    else:
        files = kubeconfig_files(env)
        config = load_files(files)
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
    )


def api_client(target: Target) -> Any:
    """A Kubernetes API client (the official Python client) for ``target``.

    Built from the minified kubeconfig only, so the Python client's own rules never choose.
    """
    if not target.makes_requests:
        raise TargetError(f"{target.description}: no requests are sent")
    from kubernetes import client
    from kubernetes import config as kconfig
    from kubernetes.config import incluster_config

    if target.kind == "in-cluster":
        host, _, port = target.server.removeprefix("https://").rpartition(":")
        configuration = client.Configuration()
        incluster_config.InClusterConfigLoader(
            token_filename=str(target.service_account_dir / "token"),
            cert_filename=str(target.service_account_dir / "ca.crt"),
            environ={
                incluster_config.SERVICE_HOST_ENV_NAME: host.strip("[]"),
                incluster_config.SERVICE_PORT_ENV_NAME: port,
            },
        ).load_and_set(configuration)
        return client.ApiClient(configuration)
    return kconfig.new_client_from_config_dict(dict(target.config or {}))
