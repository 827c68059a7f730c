"""Review findings of issue 14's tail (branch ``tail14``): one section per finding.

Each test shows the defect the review found: it failed before the fix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pmem_components import identity, preflight
from tests.unit import test_preflight_identity as pid

# --------------------------------------------------------------------------------------------
# finding 1: a stack rename (or an organisation/project rename) is not a take-over

RENAMED = identity.identity(pid.ORG, "pmem-csi-pulumi", "prod2")
OWN, THEIRS_MANAGER = "pulumi-kubernetes-aaaa", "pulumi-kubernetes-bbbb"
THEIRS = "organization/pmem-csi-pulumi/other"


def _live(obj: preflight.ObservedObject, annotation: str, entries: list[tuple[str, bool]]) -> Any:
    """``obj`` as the API server returns it: annotated with ``annotation``, with one Apply
    entry per (manager, whether it owns the stack annotation)."""
    ann = {f"f:{pid.names.STACK_ANNOTATION}": {}}
    meta: dict[str, Any] = {
        "name": obj.name,
        "uid": obj.uid,
        "labels": dict(obj.labels),
        "annotations": {pid.names.STACK_ANNOTATION: annotation},
        "managedFields": [
            {
                "manager": manager,
                "operation": "Apply",
                "fieldsV1": {"f:metadata": {"f:annotations": ann if writes else {}}},
            }
            for manager, writes in entries
        ],
    }
    return preflight._observed(
        {"apiVersion": obj.api_version, "kind": obj.kind, "metadata": meta, "spec": obj.spec},
        obj.kind,
    )


def _observed(annotation: str, entries: list[tuple[str, bool]]) -> Any:
    return pid.Observed(
        namespaces={"pmem-csi": _live(pid.ns(), annotation, entries)},
        crs={pid.DRIVER: _live(pid.cr(), annotation, entries)},
    )


def _renamed_state() -> identity.StackState:
    return dataclasses.replace(pid.state_with_urns(OWN), stack_id=RENAMED)


DEP = {"name": pid.DRIVER, "namespace": "pmem-csi"}


@pytest.mark.parametrize("old", [pid.ME, pid.OLD_FORM, "other-org/other-project/prod"])
def test_after_a_stack_rename_the_next_update_is_not_refused(old: str) -> None:
    """``pulumi stack rename prod prod2``: every object still carries the old identity, and
    this stack's own manager wrote it; nothing has been taken over."""
    observed = _observed(old, [(OWN, True)])
    plan = pid.plan(pid.stack(DEP), observed, RENAMED, _renamed_state())
    assert plan.problems == []
    assert preflight._taker(observed.crs[pid.DRIVER], _renamed_state()) is None


def test_after_a_stack_rename_a_drop_is_not_refused_as_taken_over() -> None:
    observed = _observed(pid.ME, [(OWN, True)])
    plan = pid.plan(pid.stack(), observed, RENAMED, _renamed_state())
    assert not any("taken it over" in p for p in plan.problems), plan.problems


def test_an_adoption_without_take_over_is_still_refused_after_the_fix() -> None:
    """takeOverFields: false leaves this stack's entry, but the other stack's apply wrote
    its identity: taken over."""
    observed = _observed(THEIRS, [(OWN, False), (THEIRS_MANAGER, True)])
    state = dataclasses.replace(pid.state_with_urns(OWN), stack_id=pid.ME)
    problems = pid.plan(pid.stack(), observed, pid.ME, state).problems
    assert len(problems) == 2, problems
    assert all(THEIRS in p and "pulumi state delete" in p for p in problems), problems
    problems = pid.plan(pid.stack(DEP), observed, pid.ME, state).problems
    assert any("another stack has taken it over since" in p for p in problems), problems


# --------------------------------------------------------------------------------------------
# finding 2: no bearer token text in any message

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from pmem_components import kubetarget  # noqa: E402
from pmem_components.kubetarget import Environment, ProviderSettings  # noqa: E402
from tests.unit import test_tail14 as t14  # noqa: E402

SECRET = "S3CRET"


def _client(
    tmp_path: Path, content: str, server: str = t14.PROD, **user: Any
) -> tuple[Any, Path]:
    token_file = tmp_path / "token"
    token_file.write_text(content)
    doc = t14.config(server, tokenFile=str(token_file), **user)
    target = kubetarget.resolve(
        ProviderSettings(kubeconfig=json.dumps(doc)),
        Environment(home=str(tmp_path), service_account_dir=tmp_path / "none"),
    )
    return kubetarget.api_client(target), token_file


def _bearer(api: Any) -> str:
    return str(api.configuration.auth_settings()["BearerToken"]["value"])


def test_a_token_file_ending_in_a_newline_and_then_removed_sends_the_trimmed_token(
    tmp_path: Path,
) -> None:
    api, token_file = _client(tmp_path, f"{SECRET}\n")
    token_file.unlink()
    assert _bearer(api) == f"Bearer {SECRET}"


def _messages_of_failed_reads(api: Any) -> list[str]:
    """What the drop check, the preflight, the take-over and the CA-change read say when a
    request with ``api`` fails."""
    import asyncio

    import pulumi

    from pmem_components import dropcheck, program, takeover_transform
    from pmem_components.config import ConfigError
    from pmem_components.takeover_transform import KubeApi

    out: list[str] = []
    state = dataclasses.replace(pid.state_with_urns(), stack_id=pid.ME)
    out += dropcheck.check([("v1", "Namespace", "pmem-csi")], state, KubeApi(api).get)
    try:
        preflight.run(pid.stack(DEP), pid.ME, api, state)
    except preflight.PreflightError as err:
        out.append(str(err))
    source = SimpleNamespace(
        name="p",
        target=_async(SimpleNamespace(makes_requests=True, description="c")),
        api=_async(KubeApi(api)),
    )
    take = takeover_transform.TakeOver(source=source, log=out.append, skipped_types=frozenset())  # type: ignore[arg-type]
    args = pulumi.ResourceTransformArgs(
        custom=True, type_="kubernetes:core/v1:Namespace", name="ns",
        props={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pmem-csi"}},
        opts=pulumi.ResourceOptions(),
    )  # fmt: skip
    original = pulumi.runtime.is_dry_run
    pulumi.runtime.is_dry_run = lambda: False  # type: ignore[assignment]
    try:
        asyncio.run(take.transform(args))
    except takeover_transform.TakeOverError as err:
        out.append(str(err))
    except ConfigError as err:
        out.append(str(err))
    finally:
        pulumi.runtime.is_dry_run = original  # type: ignore[assignment]
    warnings: list[str] = []
    original_warn = pulumi.log.warn
    pulumi.log.warn = lambda m, *a, **k: warnings.append(m)  # type: ignore[assignment]
    try:
        stack = pid.stack(DEP)
        phases = program.certificate_rollout(stack, api, {})
    finally:
        pulumi.log.warn = original_warn  # type: ignore[assignment]
    out += warnings + [str(v) for v in (phases or {}).values()]
    return out


def _async(value: Any) -> Any:
    async def get() -> Any:
        return value

    return get


@pytest.fixture
def listening() -> Any:
    """A loopback port that accepts connections (the kernel's backlog) and answers nothing:
    a request gets as far as sending its headers."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_request_exception_text_with_the_token_is_not_copied_into_messages(
    tmp_path: Path, listening: str
) -> None:
    """A token with a newline inside: http.client refuses the header and names its value
    (``Invalid header value b'Bearer S3CRET\\nX'``); none of that reaches a message."""
    api, _ = _client(tmp_path, f"{SECRET}\nX\n", listening)
    messages = _messages_of_failed_reads(api)
    assert len(messages) >= 3, messages
    assert all("Invalid header value" in m or "ValueError" in m for m in messages), messages
    assert not [m for m in messages if SECRET in m], messages


def test_redact_hides_header_values_and_url_passwords() -> None:
    text = (
        "Invalid header value b'Bearer S3CRET\\n' for http://user:pa55@proxy:3128, "
        "Authorization: Basic dXNlcjpwYTU1, Proxy-Authorization: Basic abc"
    )
    out = kubetarget.redact(text)
    assert SECRET not in out and "pa55" not in out and "dXNlcjpwYTU1" not in out, out
    assert "abc" not in out and "proxy:3128" in out, out


# --------------------------------------------------------------------------------------------
# findings 3 and 4: proxy passwords are not printed, and they are sent as client-go sends them

from pmem_components.kubetarget import TargetError  # noqa: E402


def _target_with_proxy(tmp_path: Path, proxy: str, server: str = t14.REMOTE) -> Any:
    doc = t14.config(server)
    doc["clusters"][0]["cluster"]["proxy-url"] = proxy
    return kubetarget.resolve(
        ProviderSettings(kubeconfig=json.dumps(doc)),
        Environment(home=str(tmp_path), service_account_dir=tmp_path / "none"),
    )


def test_a_bad_proxy_url_scheme_is_refused_without_its_password(tmp_path: Path) -> None:
    with pytest.raises(TargetError) as err:
        _target_with_proxy(tmp_path, "ftp://user:pa55@p:21")
    text = str(err.value)
    assert "proxy-url" in text and "ftp://p:21" in text, text
    assert "pa55" not in text and "user" not in text, text


def test_the_pysocks_refusal_names_the_proxy_without_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "socks" else real(name, *a)
    )
    target = _target_with_proxy(tmp_path, "socks5://user:pa55@s:1080")
    with pytest.raises(TargetError) as err:
        kubetarget.api_client(target)
    text = str(err.value)
    assert "socks5://s:1080" in text and "PySocks" in text, text
    assert "pa55" not in text and "user:" not in text, text


class _Proxy:
    """A tiny HTTP proxy on loopback: records each request's header block, answers 403."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data.decode("latin-1"))
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy() -> Any:
    p = _Proxy()
    yield p
    p.close()


@pytest.mark.parametrize("server", [t14.REMOTE, "http://10.1.2.3:8080"])
def test_the_proxy_login_in_proxy_url_is_sent_as_client_go_sends_it(
    tmp_path: Path, proxy: _Proxy, server: str
) -> None:
    """Go's transport sends ``Proxy-Authorization: Basic`` from the proxy URL's userinfo
    (decoded), for a CONNECT tunnel and a forwarded plain request alike."""
    import base64

    from kubernetes import client

    target = _target_with_proxy(tmp_path, f"http://us%40er:pa%3A55@127.0.0.1:{proxy.port}", server)
    api = kubetarget.api_client(target)
    api.configuration.retries = 0
    with pytest.raises(Exception):  # noqa: B017 - the proxy refuses; its records count
        client.CoreV1Api(api).list_namespace()
    api.close()
    assert proxy.requests, "no request reached the proxy"
    expected = "Proxy-Authorization: Basic " + base64.b64encode(b"us@er:pa:55").decode()
    first = proxy.requests[0]
    assert expected.lower() in first.lower(), first
    assert "us%40er" not in first and "pa%3A55" not in first, first


def test_a_socks5_proxy_resolves_the_name_at_the_proxy(tmp_path: Path) -> None:
    """Go's socks5 dialer sends the host name to the proxy: urllib3's ``socks5h``."""
    target = _target_with_proxy(tmp_path, "socks5://user:pa55@s:1080")
    proxy_url, headers = kubetarget.proxy_settings(target.proxy)
    assert proxy_url == "socks5h://user:pa55@s:1080" and headers is None


# --------------------------------------------------------------------------------------------
# finding 6: a tokenFile that stops being readable: the last good token, as client-go's
# cachingTokenSource; the static token only while the file was never readable


def test_a_token_file_removed_later_keeps_the_last_token_read_over_the_static_one(
    tmp_path: Path,
) -> None:
    api, token_file = _client(tmp_path, "from-file\n", token="static")
    assert _bearer(api) == "Bearer from-file"
    token_file.write_text("rotated\n")
    assert _bearer(api) == "Bearer rotated"
    token_file.unlink()
    assert _bearer(api) == "Bearer rotated"
    token_file.write_text("   \n")  # empty: client-go's read fails, the cached token stays
    assert _bearer(api) == "Bearer rotated"


def test_the_static_token_is_sent_while_the_token_file_was_never_readable(
    tmp_path: Path,
) -> None:
    _, token_file = _client(tmp_path, "x", token="static")
    token_file.unlink()
    api2 = _client_for(tmp_path, token_file, token="static")
    assert _bearer(api2) == "Bearer static"
    token_file.write_text("later\n")
    assert _bearer(api2) == "Bearer later"
    token_file.unlink()
    assert _bearer(api2) == "Bearer later"


def test_an_empty_token_file_without_a_static_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match=r"tokenFile .*empty"):
        _client(tmp_path, "\n")


def _client_for(tmp_path: Path, token_file: Path, **user: Any) -> Any:
    doc = t14.config(tokenFile=str(token_file), **user)
    target = kubetarget.resolve(
        ProviderSettings(kubeconfig=json.dumps(doc)),
        Environment(home=str(tmp_path), service_account_dir=tmp_path / "none"),
    )
    return kubetarget.api_client(target)


# --------------------------------------------------------------------------------------------
# finding 5: pmem-csi:preflight: false and the drop check


def _drops_off(monkeypatch: pytest.MonkeyPatch, **patch: Any) -> Any:
    """``program.preflight`` with the preflight off, this stack's state holding the default
    deployment's CR and namespace, and a configuration that drops both."""
    from pmem_components import program

    monkeypatch.setattr(identity, "read_state", lambda _name: _state_me())
    monkeypatch.setattr("pmem_components.components.stack_id", lambda: pid.ME)
    monkeypatch.setattr(
        program, "cluster_target",
        patch.pop("cluster_target", lambda: kubetarget.Target(
            kind="kubeconfig", server="https://x:1", description="x")),
    )  # fmt: skip
    for name, value in patch.items():
        monkeypatch.setattr(name, value)
    return program.preflight(pid.stack(preflight=False))


def _state_me() -> identity.StackState:
    return dataclasses.replace(pid.state_with_urns(), stack_id=pid.ME)


def test_an_unreachable_cluster_names_the_state_delete_that_forgets_the_drops() -> None:
    """The provider's deleteUnreachable: the cluster is gone, the drop cannot be checked.
    The refusal names the way forward, per object: the state delete of its URN."""
    from pmem_components import dropcheck

    def get(path: str) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")

    state = _state_me()
    drops = dropcheck.dropped(pid.stack(), state)
    problems = dropcheck.check(drops, state, get)
    assert len(problems) == 2, problems
    by_kind = {("Namespace" if "namespace 'pmem-csi'" in p else "CR"): p for p in problems}
    assert f"pulumi state delete --yes '{pid.NS_URN}'" in by_kind["Namespace"], problems
    assert (
        f"pulumi state delete --target-dependents --yes '{pid.COMPONENT_URN}'" in by_kind["CR"]
    ), problems
    assert all("unreachable" in p and "deleteUnreachable" in p for p in problems), problems


def test_a_client_the_drop_check_cannot_build_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pmem_components.config import ConfigError

    def refuse(_target: Any) -> Any:
        raise TargetError("user tokenFile /t: cannot read it (No such file or directory)")

    with pytest.raises(ConfigError) as err:
        _drops_off(monkeypatch, **{"pmem_components.kubetarget.api_client": refuse})
    text = str(err.value)
    assert "pmem-csi:preflight: false" in text and "tokenFile /t" in text, text
    assert "pulumi state delete" in text, text


def test_no_cluster_for_the_drop_check_is_said_in_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pulumi

    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda m, *a, **k: warnings.append(m))

    def none() -> Any:
        raise TargetError("kubeconfig /nowhere: no current context")

    _drops_off(monkeypatch, cluster_target=none)
    assert len(warnings) == 1, warnings
    text = warnings[0]
    assert "pmem-csi:preflight: false" in text and "no current context" in text, text
    assert "adopted" in text and "not checked" in text, text


def test_the_drop_checks_client_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[bool] = []

    class Client:
        def close(self) -> None:
            closed.append(True)

    class Api:
        def __init__(self, client: Any) -> None:
            pass

        def get(self, path: str) -> Any:
            return None  # gone: nothing to refuse

    _drops_off(
        monkeypatch,
        **{
            "pmem_components.kubetarget.api_client": lambda _t: Client(),
            "pmem_components.takeover_transform.KubeApi": Api,
        },
    )
    assert closed == [True]


# --------------------------------------------------------------------------------------------
# finding 8: inputs that name another object: no apply under the old name


@pytest.mark.parametrize("field", ["name", "kind"])
def test_the_take_over_applies_nothing_when_the_inputs_name_another_object(
    monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
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
    messages: list[str] = []
    take = takeover_transform.TakeOver(
        source=adopted.FakeSource(api),  # type: ignore[arg-type]
        log=messages.append,
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
    if field == "name":
        checked["metadata"]["name"] = "d-renamed"  # a later transform renamed it
    else:
        checked["kind"] = "Deployment"
    hook_args = SimpleNamespace(
        type=type_, name="x", old_outputs={"__fieldManager": adopted.MINE}, new_inputs=checked
    )
    asyncio.run(take.before_update(hook_args))  # type: ignore[arg-type]
    assert not [c for c in api.calls if c[0] in ("apply", "json_patch")], api.calls
    assert api.applied == []


# --------------------------------------------------------------------------------------------
# finding 7: plain scalars typed as client-go's YAML (sigs.k8s.io/yaml on go-yaml v2) types them
#
# Measured with clientcmd.Load of client-go v0.36.3 (a Go program printing the loaded
# config as JSON, next to the probe in /tmp/probe14): each value written plain as
# ``current-context: <value>`` and as a context's ``namespace``; None: Load refuses the text.

STRING_CASES: list[tuple[str, str | None]] = [
    ("1:20", "1:20"),  # YAML 1.1 sexagesimal for PyYAML (80)
    ("190:20:30", "190:20:30"),
    ("-1:20", "-1:20"),
    ("1:2:3.5", "1:2:3.5"),
    ("=", "="),  # PyYAML: the value key, which its safe loader cannot construct
    ("<<", "<<"),
    ("2001-01-01", "2001-01-01"),  # a timestamp: go-yaml v2 keeps the text
    ("2001-12-14 21:59:43.10 -5", "2001-12-14 21:59:43.10 -5"),
    ("2001-12-14t21:59:43.10-05:00", "2001-12-14t21:59:43.10-05:00"),
    ("oN", "oN"),
    ("tRue", "tRue"),
    ("nULL", "nULL"),
    (".", "."),
    ("+", "+"),
    ("1e", "1e"),
    ("0x1p-2", "0x1p-2"),
    ("infinity", "infinity"),
    (".e3", ".e3"),
    ("~", ""),
    ("null", ""),
    ("Null", ""),
    ("NULL", ""),
    ("y", None),  # a boolean for go-yaml v2, a string for PyYAML
    ("Y", None),
    ("n", None),
    ("N", None),
    ("yes", None),
    ("Yes", None),
    ("on", None),
    ("off", None),
    ("True", None),
    ("0o17", None),  # numbers for Go's strconv (base prefixes, underscores), strings for PyYAML
    ("0O17", None),
    ("1_000", None),
    ("1__0", None),
    ("0x_1F", None),
    ("0x1F", None),
    ("0X1f", None),
    ("-0x1F", None),
    ("012", None),
    ("08", None),
    ("1e3", None),
    ("-.5e3", None),
    (".5", None),
    ("1.", None),
    ("0.", None),
    ("+12", None),
    ("1.5", None),
    ("0b101", None),
    ("0B101", None),
    ("9223372036854775808", None),
    ("99999999999999999999999", None),
    (".inf", None),
    ("+.inf", None),
    ("-.inf", None),
    (".nan", None),
]


@pytest.mark.parametrize("case", STRING_CASES, ids=[c[0] for c in STRING_CASES])
def test_a_plain_string_value_is_typed_as_client_go_types_it(case: tuple[str, str | None]) -> None:
    value, expected = case
    text = (
        f"current-context: {value}\n"
        "contexts:\n"
        f"- name: c\n  context: {{cluster: a, namespace: {value}}}\n"
    )
    if expected is None:
        with pytest.raises(TargetError, match="current-context must be a string"):
            kubetarget.parse(text, "k")
        return
    config = kubetarget.parse(text, "k")
    assert config.current_context == expected
    assert str(config.contexts["c"].get("namespace") or "") == expected


BOOL_CASES: list[tuple[str, bool | None]] = [
    *[(v, True) for v in ("y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True")],
    *[(v, True) for v in ("TRUE",)],
    *[(v, False) for v in ("n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False")],
    ("1", None),
    ("0", None),
    ('"true"', None),
    ("t", None),
    ("f", None),
]


@pytest.mark.parametrize("case", BOOL_CASES, ids=[c[0] for c in BOOL_CASES])
def test_insecure_skip_tls_verify_takes_go_yaml_v2s_booleans(case: tuple[str, bool | None]) -> None:
    value, expected = case
    text = (
        "clusters:\n- name: a\n"
        f'  cluster: {{server: "https://x:1", insecure-skip-tls-verify: {value}}}\n'
    )
    if expected is None:
        with pytest.raises(TargetError, match="insecure-skip-tls-verify must be true or false"):
            kubetarget.parse(text, "k")
        return
    assert kubetarget.parse(text, "k").clusters["a"]["insecure-skip-tls-verify"] is expected


def test_a_context_named_like_a_sexagesimal_number_is_chosen_by_its_name(tmp_path: Path) -> None:
    text = (
        "current-context: 1:20\n"
        "clusters:\n- name: 1:20\n  cluster: {server: 'https://127.0.0.20:1'}\n"
        "contexts:\n- name: 1:20\n  context: {cluster: 1:20, user: u, namespace: =}\n"
        "users:\n- name: u\n  user: {token: t}\n"
    )
    target = kubetarget.resolve(
        ProviderSettings(kubeconfig=text),
        Environment(home=str(tmp_path), service_account_dir=tmp_path / "none"),
    )
    assert (target.context, target.server) == ("1:20", "https://127.0.0.20:1")


def test_a_stack_under_the_old_name_that_adopted_without_take_over_is_a_take_over() -> None:
    """Stack ``prod`` renamed ``prod-old`` without an ``up``; a new ``prod`` adopts its objects
    with takeOverFields false: both managers own the (same) identity value. The renamed stack
    must not delete or fight them (re-review of the tail's fixes, finding 1)."""
    observed = _observed(pid.ME, [(OWN, True), (THEIRS_MANAGER, True)])
    assert preflight._taker(observed.crs[pid.DRIVER], _renamed_state()) == OWN
    problems = pid.plan(pid.stack(), observed, RENAMED, _renamed_state()).problems
    assert problems and all("pulumi state delete" in p for p in problems), problems


def test_a_client_the_preflight_cannot_build_is_its_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pmem_components import program

    monkeypatch.setattr(program, "cluster_target", lambda: SimpleNamespace(
        makes_requests=True, description="x"))  # fmt: skip
    monkeypatch.setattr(identity, "read_state", lambda _sid: identity.StackState({}))
    monkeypatch.setattr(program, "stack_id", lambda: pid.ME, raising=False)

    def broken(_target: Any) -> Any:
        raise ValueError("Failed to parse: 'user:pa' is not a valid host")  # urllib3's text

    monkeypatch.setattr(kubetarget, "api_client", broken)
    with pytest.raises(preflight.PreflightError) as err:
        program.preflight(pid.stack(DEP))
    assert "user:pa" not in str(err.value) and "ValueError" in str(err.value)
