"""The program's own client connects where the default Kubernetes provider does (issue 14, 1).

``program.kube_client()`` is what the preflight and the field take-over use. Each test sets
the stack config (``kubernetes:*``) and the environment one way and checks the server the
client would contact; the expected servers are client-go's (see tests/unit/test_kubetarget.py,
checked against kubectl by tests/e2e/test_one_cluster.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pulumi.runtime import config as runtime_config

from pmem_components import program
from tests.unit.test_kubetarget import (
    BOTH_FILE,
    PROD,
    PROD_FILE,
    STAGING,
    STAGING_FILE,
)


@pytest.fixture
def stack_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """The stack config the program reads; the environment without kubeconfig or pod."""
    values: dict[str, str] = {}
    monkeypatch.setattr(runtime_config, "get_config", values.get)
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return values


def host(client: object) -> str:
    return client.configuration.host  # type: ignore[attr-defined]


def test_several_kubeconfig_files_first_current_context_wins(
    stack_config: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prod").write_text(PROD_FILE)
    (tmp_path / "staging").write_text(STAGING_FILE)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'prod'}:{tmp_path / 'staging'}")
    assert host(program.kube_client()) == PROD


def test_an_empty_kubeconfig_file_in_the_list_is_skipped(
    stack_config: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").write_text("")
    (tmp_path / "staging").write_text(STAGING_FILE)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'empty'}:{tmp_path / 'staging'}")
    assert host(program.kube_client()) == STAGING


def test_kubeconfig_content_starting_with_a_comment(stack_config: dict[str, str]) -> None:
    stack_config["kubernetes:kubeconfig"] = "# staging\n" + STAGING_FILE
    assert host(program.kube_client()) == STAGING


def test_kubeconfig_content_starting_with_current_context(stack_config: dict[str, str]) -> None:
    text = BOTH_FILE.replace("current-context: prod\n", "")
    stack_config["kubernetes:kubeconfig"] = "current-context: staging\n" + text
    assert host(program.kube_client()) == STAGING


def test_kubernetes_cluster_is_honoured(stack_config: dict[str, str]) -> None:
    stack_config["kubernetes:kubeconfig"] = BOTH_FILE
    stack_config["kubernetes:cluster"] = "staging"
    assert host(program.kube_client()) == STAGING


def test_in_cluster_credentials_without_a_kubeconfig(
    stack_config: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pmem_components import kubetarget

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    (sa / "ca.crt").write_text("ca")
    monkeypatch.setattr(kubetarget, "SERVICE_ACCOUNT_DIR", sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert host(program.kube_client()) == "https://10.96.0.1:443"


def test_kubernetes_kubeconfig_path_wins_over_kubeconfig_env(
    stack_config: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prod").write_text(PROD_FILE)
    (tmp_path / "staging").write_text(STAGING_FILE)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "prod"))
    stack_config["kubernetes:kubeconfig"] = str(tmp_path / "staging")
    assert host(program.kube_client()) == STAGING


def test_render_yaml_to_directory_skips_the_preflight_without_a_request(
    stack_config: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No cluster is the target: nothing is read (before: the preflight read the cluster
    that KUBECONFIG names, here an address nothing listens on)."""
    import pulumi

    from pmem_components.config import load_config
    from pmem_components.preflight import Plan, PreflightError

    (tmp_path / "prod").write_text(PROD_FILE)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "prod"))
    stack_config["kubernetes:renderYamlToDirectory"] = str(tmp_path / "out")
    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *a, **k: said.append(message))
    try:
        assert program.preflight(load_config({})) == Plan()
    except PreflightError as err:
        raise AssertionError(f"the preflight sent a request: {err}") from None
    assert said and said[0].startswith("pmem-csi:preflight: skipped, ")


def test_no_cluster_at_all_fails_the_preflight_naming_the_way_out(
    stack_config: dict[str, str],
) -> None:
    from pmem_components.config import load_config
    from pmem_components.preflight import PreflightError

    with pytest.raises(PreflightError, match=r"no cluster configured.*pmem-csi:preflight: false"):
        program.preflight(load_config({}))
