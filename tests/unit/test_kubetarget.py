"""Which cluster the program's own requests go to: the provider's (client-go's) rules.

One table, :data:`CASES`, of ways to choose a cluster, each with the server the Kubernetes
provider uses. This module checks :func:`pmem_components.kubetarget.resolve` against it;
tests/e2e/test_one_cluster.py runs the same table through the locally built kubectl (client-go)
and checks that kubectl contacts the same server, so the table states client-go's behaviour,
not ours.

The servers are loopback addresses on port 1, where nothing listens: kubectl's "connection
refused" names the server it chose, without any cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from pmem_components import kubetarget
from pmem_components.kubetarget import Environment, ProviderSettings, TargetError

PROD, STAGING, DEV, OTHER = (f"https://127.0.0.{n}:1" for n in (11, 12, 13, 14))


def kubeconfig(
    clusters: dict[str, str],
    contexts: dict[str, str],
    current: str | None = None,
    users: tuple[str, ...] = ("admin",),
    ca: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A kubeconfig document: ``contexts`` maps context name -> cluster name."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": n,
                "cluster": {
                    "server": s,
                    **({"certificate-authority": ca[n]} if ca and n in ca else {}),
                },
            }
            for n, s in clusters.items()
        ],
        "contexts": [
            {"name": n, "context": {"cluster": c, "user": users[0]}} for n, c in contexts.items()
        ],
        "users": [{"name": u, "user": {"token": f"token-of-{u}"}} for u in users],
    }
    if current is not None:
        doc["current-context"] = current
    return doc


def as_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


PROD_FILE = as_yaml(kubeconfig({"prod": PROD}, {"prod": "prod"}, "prod"))
STAGING_FILE = as_yaml(kubeconfig({"staging": STAGING}, {"staging": "staging"}, "staging"))
BOTH_FILE = as_yaml(
    kubeconfig({"prod": PROD, "staging": STAGING}, {"prod": "prod", "staging": "staging"}, "prod")
)
# The same names as PROD_FILE with other servers: which file's definition wins?
SHADOW_FILE = as_yaml(
    kubeconfig({"prod": OTHER, "dev": DEV}, {"prod": "prod", "dev": "dev"}, "dev")
)
NO_CURRENT_FILE = as_yaml(kubeconfig({"dev": DEV}, {"dev": "dev"}))


@dataclass(frozen=True)
class Case:
    """One way to choose a cluster.

    ``files``: kubeconfig files (name -> text) in a temporary directory. ``env``: the
    ``KUBECONFIG`` list (file names, joined with ``:``; names not in ``files`` are missing
    files), None for unset. ``home``: a file name installed as ``~/.kube/config``.
    ``setting``: ``kubernetes:kubeconfig`` -- ``"@name"`` is the path of a file, anything else
    content. ``server``: the server the provider (client-go) uses, or ``error``: a part of the
    message when it finds none.
    """

    id: str
    files: dict[str, str] = field(default_factory=dict)
    env: tuple[str, ...] | None = None
    home: str | None = None
    setting: str | None = None
    context: str | None = None
    cluster: str | None = None
    server: str | None = None
    error: str | None = None


CASES = [
    Case("one file", {"a": PROD_FILE}, env=("a",), server=PROD),
    Case(
        "several files: the first file's current-context wins",
        {"a": PROD_FILE, "b": STAGING_FILE},
        env=("a", "b"),
        server=PROD,
    ),
    Case(
        "several files, reversed",
        {"a": PROD_FILE, "b": STAGING_FILE},
        env=("b", "a"),
        server=STAGING,
    ),
    Case(
        "first file without current-context: the next one's",
        {"a": NO_CURRENT_FILE, "b": STAGING_FILE},
        env=("a", "b"),
        server=STAGING,
    ),
    Case(
        "a name in two files: the first definition wins",
        {"a": PROD_FILE, "b": SHADOW_FILE},
        env=("b", "a"),
        context="prod",
        server=OTHER,
    ),
    Case(
        "a name in two files, other order",
        {"a": PROD_FILE, "b": SHADOW_FILE},
        env=("a", "b"),
        server=PROD,
    ),
    Case(
        "an empty file first is skipped",
        {"empty": "", "b": STAGING_FILE},
        env=("empty", "b"),
        server=STAGING,
    ),
    Case(
        "a missing file first is skipped",
        {"b": STAGING_FILE},
        env=("missing", "b"),
        server=STAGING,
    ),
    Case(
        "duplicates and empty entries in KUBECONFIG",
        {"a": PROD_FILE, "b": STAGING_FILE},
        env=("", "a", "a", "", "b"),
        server=PROD,
    ),
    Case(
        "context from another file than current-context",
        {"a": PROD_FILE, "b": STAGING_FILE},
        env=("a", "b"),
        context="staging",
        server=STAGING,
    ),
    Case("unknown context", {"a": PROD_FILE}, env=("a",), context="nope", error="'nope'"),
    Case(
        "cluster replaces the context's",
        {"a": BOTH_FILE},
        env=("a",),
        cluster="staging",
        server=STAGING,
    ),
    Case(
        "context and cluster",
        {"a": BOTH_FILE},
        env=("a",),
        context="staging",
        cluster="prod",
        server=PROD,
    ),
    Case("~/.kube/config without KUBECONFIG", {"h": STAGING_FILE}, home="h", server=STAGING),
    Case(
        "an empty KUBECONFIG means ~/.kube/config",
        {"h": STAGING_FILE},
        env=(),
        home="h",
        server=STAGING,
    ),
    Case("no kubeconfig at all", {}, env=("missing",), error="no cluster configured"),
    Case(
        "kubernetes:kubeconfig as a path wins over KUBECONFIG",
        {"a": PROD_FILE, "b": STAGING_FILE},
        env=("a",),
        setting="@b",
        server=STAGING,
    ),
    Case("kubernetes:kubeconfig content", {}, setting=BOTH_FILE, server=PROD),
    Case(
        "content starting with a comment",
        {},
        setting="# the staging cluster\n" + STAGING_FILE,
        server=STAGING,
    ),
    Case(
        "content starting with current-context",
        {},
        setting="current-context: staging\n" + BOTH_FILE.replace("current-context: prod\n", ""),
        server=STAGING,
    ),
    Case(
        "content as JSON on one line",
        {},
        setting=json.dumps(kubeconfig({"staging": STAGING}, {"s": "staging"}, "s")),
        server=STAGING,
    ),
    Case(
        "content in YAML flow style",
        {},
        setting=yaml.safe_dump(
            kubeconfig({"dev": DEV}, {"d": "dev"}, "d"), default_flow_style=True
        ),
        server=DEV,
    ),
    Case(
        "content with kubernetes:context",
        {},
        setting=BOTH_FILE,
        context="staging",
        server=STAGING,
    ),
    Case(
        "a path that does not exist is taken as content",
        {},
        setting="/nonexistent/kubeconfig",
        error="not a kubeconfig",
    ),
]


def materialize(case: Case, tmp: Path) -> tuple[ProviderSettings, Environment]:
    """The case's files in ``tmp``, and the settings and environment that name them."""
    for name, text in case.files.items():
        (tmp / name).write_text(text)
    home = tmp / "home"
    (home / ".kube").mkdir(parents=True, exist_ok=True)
    if case.home:
        (home / ".kube" / "config").write_text(case.files[case.home])
    env = Environment(
        kubeconfig=None
        if case.env is None
        else ":".join(str(tmp / n) if n else "" for n in case.env),
        home=str(home),
        service_account_dir=tmp / "no-service-account",
    )
    setting = case.setting
    if setting and setting.startswith("@"):
        setting = str(tmp / setting[1:])
    return ProviderSettings(kubeconfig=setting, context=case.context, cluster=case.cluster), env


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_resolve_picks_the_providers_cluster(case: Case, tmp_path: Path) -> None:
    settings, env = materialize(case, tmp_path)
    if case.error:
        with pytest.raises(TargetError, match=case.error):
            kubetarget.resolve(settings, env)
        return
    target = kubetarget.resolve(settings, env)
    assert target.kind == "kubeconfig"
    assert target.server == case.server
    config = target.config or {}
    assert [c["cluster"]["server"] for c in config["clusters"]] == [case.server]
    assert config["current-context"] == config["contexts"][0]["name"]


def test_relative_paths_in_a_kubeconfig_file_are_resolved_against_its_directory(
    tmp_path: Path,
) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "a").write_text(
        as_yaml(kubeconfig({"prod": PROD}, {"prod": "prod"}, "prod", ca={"prod": "ca.crt"}))
    )
    target = kubetarget.resolve(
        ProviderSettings(), Environment(kubeconfig=str(sub / "a"), home=str(tmp_path))
    )
    assert target.config["clusters"][0]["cluster"]["certificate-authority"] == str(sub / "ca.crt")


def test_relative_paths_of_a_symlinked_kubeconfig_count_from_the_links_directory(
    tmp_path: Path,
) -> None:
    """client-go takes the directory of the path as given (filepath.Abs), not of the file a
    symlink points to: ``~/.kube/config`` linked into a dotfiles repository reads
    ``~/.kube/ca.crt`` (review of issue 14: the program read the linked directory's CA)."""
    real, kube = tmp_path / "real", tmp_path / "kube"
    real.mkdir()
    kube.mkdir()
    (real / "config").write_text(
        as_yaml(kubeconfig({"prod": PROD}, {"prod": "prod"}, "prod", ca={"prod": "ca.crt"}))
    )
    (kube / "config").symlink_to(real / "config")
    target = kubetarget.resolve(
        ProviderSettings(), Environment(kubeconfig=str(kube / "config"), home=str(tmp_path))
    )
    assert target.config["clusters"][0]["cluster"]["certificate-authority"] == str(
        kube / "ca.crt"
    )


def test_relative_paths_in_kubernetes_kubeconfig_stay_as_written(tmp_path: Path) -> None:
    """The provider reads the file and parses its content: no path resolution."""
    (tmp_path / "a").write_text(
        as_yaml(kubeconfig({"prod": PROD}, {"prod": "prod"}, "prod", ca={"prod": "ca.crt"}))
    )
    target = kubetarget.resolve(
        ProviderSettings(kubeconfig=str(tmp_path / "a")), Environment(home=str(tmp_path))
    )
    assert target.config["clusters"][0]["cluster"]["certificate-authority"] == "ca.crt"


def _service_account(tmp: Path) -> Path:
    sa = tmp / "sa"
    sa.mkdir()
    (sa / "token").write_text("token")
    (sa / "ca.crt").write_text("ca")
    return sa


def test_in_cluster_credentials_when_there_is_no_kubeconfig(tmp_path: Path) -> None:
    env = Environment(
        kubeconfig=None,
        home=str(tmp_path),
        service_host="10.96.0.1",
        service_port="443",
        service_account_dir=_service_account(tmp_path),
    )
    target = kubetarget.resolve(ProviderSettings(), env)
    assert (target.kind, target.server) == ("in-cluster", "https://10.96.0.1:443")


def test_in_cluster_ipv6_host_is_bracketed(tmp_path: Path) -> None:
    env = Environment(
        home=str(tmp_path),
        service_host="fd00::1",
        service_port="443",
        service_account_dir=_service_account(tmp_path),
    )
    assert kubetarget.resolve(ProviderSettings(), env).server == "https://[fd00::1]:443"


def test_a_kubeconfig_with_a_current_context_wins_over_in_cluster(tmp_path: Path) -> None:
    (tmp_path / "a").write_text(PROD_FILE)
    env = Environment(
        kubeconfig=str(tmp_path / "a"),
        home=str(tmp_path),
        service_host="10.96.0.1",
        service_port="443",
        service_account_dir=_service_account(tmp_path),
    )
    assert kubetarget.resolve(ProviderSettings(), env).server == PROD


def test_no_in_cluster_fallback_for_explicit_kubeconfig_content(tmp_path: Path) -> None:
    env = Environment(
        home=str(tmp_path),
        service_host="10.96.0.1",
        service_port="443",
        service_account_dir=_service_account(tmp_path),
    )
    with pytest.raises(TargetError, match="no cluster configured"):
        kubetarget.resolve(ProviderSettings(kubeconfig=NO_CURRENT_FILE), env)


def test_in_cluster_api_client_uses_the_token_and_ca(tmp_path: Path) -> None:
    env = Environment(
        home=str(tmp_path),
        service_host="10.96.0.1",
        service_port="6443",
        service_account_dir=_service_account(tmp_path),
    )
    client = kubetarget.api_client(kubetarget.resolve(ProviderSettings(), env))
    conf = client.configuration
    assert conf.host == "https://10.96.0.1:6443"
    assert conf.ssl_ca_cert == str(tmp_path / "sa" / "ca.crt")
    assert conf.auth_settings()["BearerToken"]["value"].lower() == "bearer token"


def test_render_yaml_to_directory_means_no_requests(tmp_path: Path) -> None:
    target = kubetarget.resolve(
        ProviderSettings(kubeconfig=PROD_FILE, render_yaml_to_directory=str(tmp_path)),
        Environment(home=str(tmp_path)),
    )
    assert not target.makes_requests
    with pytest.raises(TargetError, match="no requests"):
        kubetarget.api_client(target)


def test_api_client_connects_to_the_chosen_server_with_its_user(tmp_path: Path) -> None:
    (tmp_path / "a").write_text(PROD_FILE)
    (tmp_path / "b").write_text(STAGING_FILE)
    env = Environment(kubeconfig=f"{tmp_path / 'a'}:{tmp_path / 'b'}", home=str(tmp_path))
    client = kubetarget.api_client(kubetarget.resolve(ProviderSettings(), env))
    assert client.configuration.host == PROD
    assert client.configuration.auth_settings()["BearerToken"]["value"] == "Bearer token-of-admin"


def test_messages_name_the_setting_of_an_explicit_provider(tmp_path: Path) -> None:
    settings = ProviderSettings(kubeconfig=PROD_FILE, context="nope", origin="provider east")
    with pytest.raises(TargetError, match="provider east argument context"):
        kubetarget.resolve(settings, Environment(home=str(tmp_path)))


def test_from_stack_config_reads_the_kubernetes_keys() -> None:
    values = {"kubernetes:context": "c", "kubernetes:renderYamlToDirectory": "/out"}
    settings = ProviderSettings.from_stack_config(values.get)
    assert (settings.context, settings.render_yaml_to_directory, settings.kubeconfig) == (
        "c",
        "/out",
        None,
    )
