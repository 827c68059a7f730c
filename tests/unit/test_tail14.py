"""Issue 14's tail: the program's own requests choose and reach the cluster as client-go does.

Each table states client-go's behaviour as measured, not ours:

* the kubeconfig texts (:data:`LOAD_CASES`) were run through ``clientcmd.Load`` of client-go
  v0.36.3 (a small Go program; ``tests/e2e/test_tail14_cluster.py`` runs the same table
  through the locally built kubectl, whose ``--kubeconfig`` file goes through the same
  ``Load``);
* home directory, ``~``, ``token``/``tokenFile`` and proxy rules are read from client-go's
  and Go's source (``util/homedir/homedir.go``, ``tools/clientcmd/loader.go``,
  ``client_config.go``, ``transport/round_trippers.go``, ``token_source.go``,
  ``golang.org/x/net/http/httpproxy``) and from pulumi-kubernetes' ``parseKubeconfigString``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pmem_components import kubetarget
from pmem_components.kubetarget import Environment, ProviderSettings, TargetError

PROD, STAGING = "https://127.0.0.11:1", "https://127.0.0.12:1"


def config(server: str = PROD, current: str = "a", **user: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": "a", "cluster": {"server": server}}],
        "contexts": [{"name": "a", "context": {"cluster": "a", "user": "u"}}],
        "users": [{"name": "u", "user": user or {"token": "t"}}],
    }


PLAIN = yaml.safe_dump(config(), sort_keys=False)


# --------------------------------------------------------------------------------------------
# item 1: the home directory and ``~``


def test_the_default_kubeconfig_is_under_HOME_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HOME unset or empty: client-go's home file is the relative ``.kube/config``
    (homedir.HomeDir returns $HOME on Linux), never the passwd entry's home."""
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("HOME", raising=False)
        else:
            monkeypatch.setenv("HOME", value)
        monkeypatch.delenv("KUBECONFIG", raising=False)
        env = Environment.current()
        assert env.home == ""
        assert kubetarget.kubeconfig_files(env) == [".kube/config"]


def test_the_home_file_is_read_relative_to_the_working_directory_without_HOME(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(PLAIN)
    monkeypatch.chdir(tmp_path)
    env = Environment(home="", service_account_dir=tmp_path / "none")
    assert kubetarget.resolve(ProviderSettings(), env).server == PROD


def test_a_tilde_in_kubernetes_kubeconfig_is_the_passwd_home_not_HOME(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pulumi-kubernetes expands ``~/`` with ``user.Current().HomeDir`` (the passwd entry),
    so with HOME pointing elsewhere (sudo -E, CI) the provider reads the passwd home's file."""
    passwd_home, env_home = tmp_path / "passwd", tmp_path / "env"
    for home, server in ((passwd_home, PROD), (env_home, STAGING)):
        home.mkdir()
        (home / "kc").write_text(yaml.safe_dump(config(server)))
    monkeypatch.setenv("HOME", str(env_home))

    class Entry:
        pw_dir = str(passwd_home)

    monkeypatch.setattr(kubetarget.pwd, "getpwuid", lambda uid: Entry)
    target = kubetarget.resolve(ProviderSettings(kubeconfig="~/kc"), Environment.current())
    assert target.server == PROD


def test_a_tilde_in_KUBECONFIG_is_not_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-go takes KUBECONFIG entries as written: ``~/kc`` is a relative path (a
    directory named ``~``), not the home's file. Pinned: kubetarget agrees already."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "kc").write_text(PLAIN)
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "kc").write_text(yaml.safe_dump(config(STAGING)))
    monkeypatch.chdir(tmp_path)
    env = Environment(kubeconfig="~/kc", home=str(home), service_account_dir=tmp_path / "none")
    assert kubetarget.resolve(ProviderSettings(), env).server == STAGING


def test_the_old_home_file_is_read_as_client_go_migrates_it(tmp_path: Path) -> None:
    """No ``$HOME/.kube/config`` but a ``$HOME/.kube/.kubeconfig``: client-go's migration
    rule copies the old file over before loading, so the provider uses it."""
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / ".kubeconfig").write_text(PLAIN)
    env = Environment(home=str(tmp_path), service_account_dir=tmp_path / "none")
    assert kubetarget.resolve(ProviderSettings(), env).server == PROD


# --------------------------------------------------------------------------------------------
# item 2: kubeconfig content in every form clientcmd.Load accepts, and its refusals

_ONE_LINE = json.dumps(config())
_TABS = json.dumps(config(), indent="\t")
# name -> (text, the current context and server client-go finds, or None: it refuses)
LOAD_CASES: dict[str, tuple[str, tuple[str, str] | None]] = {
    "json indented with tabs": (_TABS, ("a", PROD)),
    "json on one line": (_ONE_LINE, ("a", PROD)),
    "json with a BOM": ("\ufeff" + _TABS, ("a", PROD)),
    "yaml with a BOM": ("\ufeff" + PLAIN, ("a", PROD)),
    "yaml after a comment": ("# made by hand\n" + PLAIN, ("a", PROD)),
    "several documents: the first counts": (
        "---\n" + PLAIN + "---\n" + yaml.safe_dump(config(STAGING)),
        ("a", PROD),
    ),
    "a document end, then anything": (PLAIN + "...\nnot: [yaml\n", ("a", PROD)),
    "two json documents": (_ONE_LINE + "\n" + json.dumps(config(STAGING)), ("a", PROD)),
    "an empty first document": ("---\n---\n" + PLAIN, ("", "")),
    "no apiVersion and kind": (
        PLAIN.replace("apiVersion: v1\n", "").replace("kind: Config\n", ""),
        ("a", PROD),
    ),
    "tabs indenting yaml": (PLAIN.replace("  cluster:", "\tcluster:"), None),
    "another kind": (PLAIN.replace("kind: Config", "kind: Pod"), None),
    "another apiVersion": (PLAIN.replace("apiVersion: v1", "apiVersion: v2"), None),
    "a number for a string": (PLAIN.replace("current-context: a", "current-context: 1"), None),
    "a boolean for a string": (
        PLAIN.replace("current-context: a", "current-context: yes"),
        None,
    ),
    "a quoted boolean": (
        PLAIN.replace("server:", "insecure-skip-tls-verify: 'true'\n    server:"),
        None,
    ),
    "bad base64": (PLAIN.replace("server:", "certificate-authority-data: '!!'\n    server:"), None),
    "a string for a list": (PLAIN.replace("token: t", "as-groups: admins"), None),
}


@pytest.mark.parametrize("name", list(LOAD_CASES))
def test_content_is_read_as_clientcmd_load_reads_it(name: str) -> None:
    text, expected = LOAD_CASES[name]
    if expected is None:
        with pytest.raises(TargetError, match=r"^kubernetes:kubeconfig"):
            kubetarget.parse(text, "kubernetes:kubeconfig")
        return
    parsed = kubetarget.parse(text, "kubernetes:kubeconfig")
    current, server = expected
    assert parsed.current_context == current
    assert {str(c.get("server")) for c in parsed.clusters.values()} == ({server} - {""})


@pytest.mark.parametrize("name", ["json indented with tabs", "several documents: the first counts"])
def test_content_in_kubernetes_kubeconfig_chooses_the_first_documents_cluster(
    name: str, tmp_path: Path
) -> None:
    env = Environment(home=str(tmp_path), service_account_dir=tmp_path / "none")
    target = kubetarget.resolve(ProviderSettings(kubeconfig=LOAD_CASES[name][0]), env)
    assert target.server == PROD


def test_a_kubeconfig_file_with_a_bom_and_tabs_is_read_too(tmp_path: Path) -> None:
    (tmp_path / "kc").write_bytes(("\ufeff" + _TABS).encode())
    env = Environment(kubeconfig=str(tmp_path / "kc"), service_account_dir=tmp_path / "none")
    assert kubetarget.resolve(ProviderSettings(), env).server == PROD


# --------------------------------------------------------------------------------------------
# item 3: which token is sent, and through which proxy


def _bearer(target: kubetarget.Target) -> str:
    api = kubetarget.api_client(target)
    return str(api.configuration.auth_settings()["BearerToken"]["value"])


def _target(tmp_path: Path, doc: dict[str, Any]) -> kubetarget.Target:
    return kubetarget.resolve(
        ProviderSettings(kubeconfig=json.dumps(doc)),
        Environment(home=str(tmp_path), service_account_dir=tmp_path / "none"),
    )


def test_token_file_wins_over_token_and_is_read_again(tmp_path: Path) -> None:
    """rest.Config: BearerTokenFile's content (trimmed, re-read) over BearerToken."""
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    target = _target(tmp_path, config(token="static", tokenFile=str(token_file)))
    api = kubetarget.api_client(target)
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer from-file"
    token_file.write_text("rotated\n")
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer rotated"
    token_file.unlink()  # unreadable now: client-go keeps the last token it read
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer rotated"


def test_token_file_alone_is_trimmed(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("only-file\n")
    assert _bearer(_target(tmp_path, config(tokenFile=str(token_file)))) == "Bearer only-file"


def test_token_file_alone_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    target = _target(tmp_path, config(tokenFile=str(tmp_path / "missing")))
    with pytest.raises(TargetError, match="tokenFile"):
        kubetarget.api_client(target)


REMOTE = "https://10.1.2.3:6443"
# (server, environment, proxy-url or None) -> the proxy client-go uses (None: direct)
PROXY_CASES: list[tuple[str, str, dict[str, str], str | None, str | None]] = [
    ("https via HTTPS_PROXY", REMOTE, {"HTTPS_PROXY": "http://p:3128"}, None, "http://p:3128"),
    ("loopback never proxied", PROD, {"HTTPS_PROXY": "http://p:3128"}, None, None),
    (
        "localhost never proxied",
        "https://localhost:6443",
        {"HTTPS_PROXY": "http://p:1"},
        None,
        None,
    ),
    (
        "upper case first",
        REMOTE,
        {"HTTPS_PROXY": "http://up:1", "https_proxy": "http://lo:1"},
        None,
        "http://up:1",
    ),
    ("lower case alone", REMOTE, {"https_proxy": "http://lo:1"}, None, "http://lo:1"),
    ("no HTTP_PROXY for https", REMOTE, {"HTTP_PROXY": "http://p:1"}, None, None),
    ("no ALL_PROXY", REMOTE, {"ALL_PROXY": "http://p:1", "all_proxy": "http://p:1"}, None, None),
    ("bare host:port is http", REMOTE, {"HTTPS_PROXY": "p:3128"}, None, "http://p:3128"),
    ("NO_PROXY cidr", REMOTE, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None, None),
    ("NO_PROXY ip", REMOTE, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3"}, None, None),
    (
        "NO_PROXY other port",
        REMOTE,
        {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3:443"},
        None,
        "http://p:1",
    ),
    (
        "NO_PROXY domain",
        "https://api.corp.example:6443",
        {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "corp.example"},
        None,
        None,
    ),
    ("NO_PROXY star", REMOTE, {"HTTPS_PROXY": "http://p:1", "no_proxy": "*"}, None, None),
    (
        "proxy-url over the environment",
        REMOTE,
        {"HTTPS_PROXY": "http://p:1"},
        "http://cluster-proxy:8080",
        "http://cluster-proxy:8080",
    ),
    ("proxy-url ignores NO_PROXY", REMOTE, {"NO_PROXY": "*"}, "http://cp:8080", "http://cp:8080"),
    ("proxy-url for loopback too", PROD, {}, "http://cp:1", "http://cp:1"),
]


@pytest.mark.parametrize("case", PROXY_CASES, ids=[c[0] for c in PROXY_CASES])
def test_the_client_uses_client_gos_proxy(
    case: tuple[str, str, dict[str, str], str | None, str | None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, server, environ, proxy_url, expected = case
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    doc = config(server)
    if proxy_url:
        doc["clusters"][0]["cluster"]["proxy-url"] = proxy_url
    # The environment as the process has it: the Python client would read it by itself.
    env_now = dataclasses.replace(
        Environment.current(), home=str(tmp_path), service_account_dir=tmp_path / "none"
    )
    target = kubetarget.resolve(ProviderSettings(kubeconfig=json.dumps(doc)), env_now)
    configuration = kubetarget.api_client(target).configuration
    from kubernetes.client import rest

    used = configuration.proxy
    if used and rest.should_bypass_proxies(configuration.host, configuration.no_proxy or ""):
        used = None
    assert used == expected


def test_an_unsupported_proxy_url_scheme_is_refused(tmp_path: Path) -> None:
    doc = config(REMOTE)
    doc["clusters"][0]["cluster"]["proxy-url"] = "ftp://p:21"
    with pytest.raises(TargetError, match="proxy-url"):
        _target(tmp_path, doc)


def test_in_cluster_credentials_use_go_proxy_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No kubeconfig, in a pod: the environment's proxy by Go's rules (upper case first)."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_text("not checked here")
    monkeypatch.setenv("HTTPS_PROXY", "http://up:1")
    monkeypatch.setenv("https_proxy", "http://lo:1")
    env = dataclasses.replace(
        Environment.current(),
        kubeconfig=None,
        home=str(tmp_path),
        service_host="10.96.0.1",
        service_port="443",
        service_account_dir=sa,
    )
    target = kubetarget.resolve(ProviderSettings(), env)
    assert target.kind == "in-cluster"
    assert kubetarget.api_client(target).configuration.proxy == "http://up:1"


def test_a_socks_proxy_the_client_cannot_use_is_refused_by_name(tmp_path: Path) -> None:
    """client-go reaches the cluster through a socks5 proxy-url; the Python client needs
    PySocks for it (not installed): the program says so instead of failing in urllib3."""
    doc = config(REMOTE)
    doc["clusters"][0]["cluster"]["proxy-url"] = "socks5://s:1080"
    with pytest.raises(TargetError, match=r"proxy socks5://s:1080.*PySocks"):
        kubetarget.api_client(_target(tmp_path, doc))


# --------------------------------------------------------------------------------------------
# item 4: the take-over applies what the provider applies


def _take_over_with_a_later_change(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """A DaemonSet whose declared field a ``kubectl edit`` owns, registered with image ``a``;
    the provider's checked inputs (a transform registered after ours, the provider's Check)
    say image ``b``, a namespace the provider's Check filled in, and a secret value."""
    import asyncio
    import copy

    import pulumi

    from pmem_components import takeover_transform
    from tests.unit import test_takeover_adopted as adopted

    api = adopted.FakeApi()
    api.entries = [
        {"manager": adopted.MINE, "operation": "Apply", "fieldsV1": adopted.LABELS},
        {"manager": "kubectl-edit", "operation": "Update",
         "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}}},
    ]  # fmt: skip
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    take = takeover_transform.TakeOver(
        source=adopted.FakeSource(api),  # type: ignore[arg-type]
        log=lambda _m: None,
        skipped_types=frozenset(),
    )
    declared = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "pmem-csi"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "a"}]}}},
    }
    type_ = "kubernetes:apps/v1:DaemonSet"
    args = pulumi.ResourceTransformArgs(
        custom=True, type_=type_, name="x", props=copy.deepcopy(declared),
        opts=pulumi.ResourceOptions(),
    )  # fmt: skip
    result = asyncio.run(take.transform(args))
    assert result is not None
    checked = copy.deepcopy(dict(result.props))
    checked["spec"]["template"]["spec"]["containers"][0]["image"] = "b"
    checked["__fieldManager"] = adopted.MINE  # internal keys are not applied

    async def hook() -> None:
        inputs = dict(checked)
        inputs["metadata"] = {
            **checked["metadata"],
            "labels": {"k": pulumi.Output.secret("v")},  # a secret, as hooks hand it over
        }
        hook_args = SimpleNamespace(
            type=type_, name="x", old_outputs={"__fieldManager": adopted.MINE},
            new_inputs=inputs,
        )  # fmt: skip
        await take.before_update(hook_args)  # type: ignore[arg-type]

    asyncio.run(hook())
    return api, checked


def test_the_take_over_applies_the_providers_inputs_not_the_transform_time_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, checked = _take_over_with_a_later_change(monkeypatch)
    (applied,) = api.applied
    assert applied["spec"]["template"]["spec"]["containers"][0]["image"] == "b"
    assert applied["metadata"]["labels"] == {"k": "v"}
    assert "__fieldManager" not in applied
    assert applied["metadata"]["annotations"] == checked["metadata"]["annotations"]


# --------------------------------------------------------------------------------------------
# item 5: list-map keys with a field the server defaults

# A container declared with its port but without ``protocol`` (the server defaults it to TCP
# and keys the list entry by both), and a Service port alike.
PORTS_DECLARED = {
    "spec": {
        "ports": [{"port": 80, "targetPort": 9090}],
        "template": {
            "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 9090, "name": "m"}]}]}
        },
    }
}
# What the API server records for a ``kubectl edit`` that renamed the port (tests/e2e/
# test_tail14_cluster.py reads the same structure from the local cluster).
EDITED_PORT = {
    "f:spec": {
        "f:template": {
            "f:spec": {
                "f:containers": {
                    'k:{"name":"c"}': {
                        "f:ports": {
                            'k:{"containerPort":9090,"protocol":"TCP"}': {
                                ".": {},
                                "f:name": {},
                            }
                        }
                    }
                }
            }
        }
    }
}


@pytest.mark.parametrize(
    ("fields", "declared"),
    [
        (EDITED_PORT, True),
        # the same port number over UDP is another entry: not the declared one
        (json.loads(json.dumps(EDITED_PORT).replace('\\"TCP\\"', '\\"UDP\\"')), False),
        ({"f:spec": {"f:ports": {'k:{"port":80,"protocol":"TCP"}': {"f:targetPort": {}}}}}, True),
        ({"f:spec": {"f:ports": {'k:{"port":81,"protocol":"TCP"}': {"f:targetPort": {}}}}}, False),
    ],
    ids=["container port, TCP by default", "UDP", "service port", "another service port"],
)
def test_owns_declared_matches_a_list_key_the_server_completed(
    fields: dict[str, Any], declared: bool
) -> None:
    from pmem_components.takeover_transform import owns_declared

    assert owns_declared(fields, PORTS_DECLARED) is declared


# --------------------------------------------------------------------------------------------
# item 6: allowance paths are dotted, keys hold dots


def _restart_entry(key: str, under: str = "annotations") -> dict[str, Any]:
    return {
        "manager": "ops",
        "operation": "Update",
        "fieldsV1": {"f:spec": {"f:template": {"f:metadata": {f"f:{under}": {f"f:{key}": {}}}}}},
    }


STAMP = "kubectl.kubernetes.io/restartedAt"
ANN = "spec.template.metadata.annotations"
# (allowance path, the key ops wrote under annotations, whether the allowance covers it)
COVER_CASES: list[tuple[str, str, bool]] = [
    (f"{ANN}.{STAMP}", STAMP, True),  # its own key, dots and slash inside
    (f"{ANN}.kubectl.kubernetes.io", STAMP, False),  # a prefix ending on a dot inside the key
    (f"{ANN}.kubectl", STAMP, False),
    (f"{ANN}.{STAMP}", "kubectl.kubernetes.io/restartedAtX", False),  # a longer key
    (f"{ANN}.{STAMP}", "kubectl.kubernetes.io", False),  # a shorter key
    (f"{ANN}.app", "app.kubernetes.io/name", False),
    (ANN, STAMP, True),  # a node covers everything below it
    ("spec.template.metadata.annotation", STAMP, False),  # a prefix of a field name
    ("spec.template", STAMP, True),
]


@pytest.mark.parametrize("case", COVER_CASES, ids=[f"{c[0]} / {c[1]}" for c in COVER_CASES])
def test_an_allowance_covers_its_own_key_and_no_other(case: tuple[str, str, bool]) -> None:
    from pmem_components import fieldowners

    path, key, covered = case
    allowed = [fieldowners.Allowance("ops", (path,), "test")]
    assert fieldowners.is_foreign(_restart_entry(key), allowed) is not covered


def test_a_label_allowance_does_not_cover_an_annotation_of_that_name() -> None:
    from pmem_components import fieldowners

    allowed = [fieldowners.Allowance("ops", ("spec.template.metadata.labels.app",), "test")]
    assert fieldowners.is_foreign(_restart_entry("app"), allowed)
    assert not fieldowners.is_foreign(_restart_entry("app", under="labels"), allowed)


@pytest.mark.parametrize(
    "path",
    [
        "f:spec.f:template.f:metadata.f:annotations",  # fieldsV1 notation: matches nothing
        "spec.template.metadata.annotations.",
        ".spec",
        "spec..template",
    ],
)
def test_an_allowance_path_that_can_match_nothing_is_refused_by_key(path: str) -> None:
    from pmem_components import fieldowners

    raw = [{"manager": "ops", "paths": ["spec.replicas", path], "reason": "why"}]
    allowed, problems = fieldowners.parse_allowed(raw, "pmem-csi:allowedFieldOwners")
    assert allowed == []
    assert len(problems) == 1
    assert problems[0].startswith("pmem-csi:allowedFieldOwners[0].paths[1]: "), problems
    assert "spec.template.metadata.annotations" in problems[0]  # the form to write


# --------------------------------------------------------------------------------------------
# item 7: the adopted-away refusal, also with the preflight off, also without a take-over

from tests.unit import test_preflight_identity as pid  # noqa: E402

THEIRS = "organization/pmem-csi-pulumi/other"


def _state(**kw: Any) -> Any:

    return dataclasses.replace(pid.state_with_urns(), stack_id=pid.ME, **kw)


def _co_owned(obj: Any) -> Any:
    """``obj`` after another stack adopted it with ``takeOverFields: false``: its apply
    (forced, patchForce) rewrote the stack annotation, and this stack's entry stayed."""
    from pmem_components.preflight import ObservedObject

    fields = {
        **obj.__dict__,
        "pulumi_managers": ("pulumi-kubernetes-aaaa", "pulumi-kubernetes-bbbb"),
        "identity_writers": ("pulumi-kubernetes-bbbb",),  # its apply wrote the annotation
    }
    fields["annotations"] = {pid.names.STACK_ANNOTATION: THEIRS}
    return ObservedObject(**fields)


def test_a_dropped_object_another_stack_adopted_without_take_over_is_not_deleted() -> None:
    observed = pid.Observed(
        namespaces={"pmem-csi": _co_owned(pid.ns())}, crs={pid.DRIVER: _co_owned(pid.cr())}
    )
    problems = pid.plan(pid.stack(), observed, pid.ME, _state()).problems
    assert len(problems) == 2, problems
    assert all(THEIRS in p and "pulumi state delete" in p for p in problems), problems


def test_an_object_this_stack_still_names_is_dropped_as_before() -> None:
    observed = pid.Observed(
        namespaces={"pmem-csi": pid.taken(pid.ns(), ("pulumi-kubernetes-aaaa",))},
        crs={pid.DRIVER: pid.taken(pid.cr(), ("pulumi-kubernetes-aaaa",))},
    )
    assert pid.plan(pid.stack(), observed, pid.ME, _state()).problems == []


class _Cluster:
    """GETs of the objects a drop concerns (paths -> live objects), counted."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.paths: list[str] = []

    def get(self, path: str) -> Any:
        self.paths.append(path)
        return self.objects.get(path)


def _live(obj: Any, managers: tuple[str, ...]) -> dict[str, Any]:
    return {
        "apiVersion": obj.api_version,
        "kind": obj.kind,
        "metadata": {
            "name": obj.name,
            "uid": obj.uid,
            "annotations": dict(obj.annotations),
            "managedFields": [{"manager": m, "operation": "Apply"} for m in managers],
        },
    }


def _preflight_off(monkeypatch: pytest.MonkeyPatch, cluster: _Cluster, config: Any) -> Any:
    from pmem_components import identity, kubetarget, program

    monkeypatch.setattr(
        program, "cluster_target",
        lambda: kubetarget.Target(kind="kubeconfig", server="https://x:1", description="x"),
    )  # fmt: skip
    monkeypatch.setattr(identity, "read_state", lambda _name: _state())
    monkeypatch.setattr(
        program, "_object_reader", lambda _target: contextlib.nullcontext(cluster.get)
    )
    monkeypatch.setattr("pmem_components.components.stack_id", lambda: pid.ME)
    return program.preflight(config)


def test_with_the_preflight_off_a_drop_of_adopted_away_objects_is_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pmem_components import preflight
    from pmem_components.config import ConfigError

    ns_path = preflight._path("v1", "Namespace", None, "pmem-csi")
    cr_path = preflight._path(pid.CR_API, pid.names.CRD_KIND, None, pid.DRIVER)
    cluster = _Cluster({
        ns_path: _live(pid.ns(), ("pulumi-kubernetes-bbbb",)),
        cr_path: _live(pid.cr(), ("pulumi-kubernetes-bbbb",)),
    })  # fmt: skip
    with pytest.raises(ConfigError) as err:
        _preflight_off(monkeypatch, cluster, pid.stack(preflight=False))
    text = str(err.value)
    assert "pulumi state delete --target-dependents" in text and pid.NS_URN in text, text
    assert sorted(cluster.paths) == sorted([ns_path, cr_path])


def test_with_the_preflight_off_an_update_that_drops_nothing_reads_no_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = _Cluster({})
    dep = {"name": pid.DRIVER, "namespace": "pmem-csi"}
    plan = _preflight_off(monkeypatch, cluster, pid.stack(dep, preflight=False))
    assert plan.problems == [] and cluster.paths == []


def test_with_the_preflight_off_an_unreadable_dropped_object_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pmem_components.config import ConfigError

    class Broken(_Cluster):
        def get(self, path: str) -> Any:
            raise OSError("connection refused")

    with pytest.raises(ConfigError, match=r"pmem-csi:preflight: false.*connection refused"):
        _preflight_off(monkeypatch, Broken({}), pid.stack(preflight=False))
