"""The stand-in ``pulumi-language-nodejs`` (tools/langhost_nodejs.py) against the official host.

What the official host (``sdk/nodejs/cmd/pulumi-language-nodejs`` of Pulumi 3.276) answers, for
what the CLI asks during ``pulumi package add``, ``preview``, ``up`` and ``destroy`` of a
TypeScript program: its option checks and messages, the ``node`` command line and environment
of ``Run``, the packages ``GetRequiredPackages`` finds, what ``Link`` writes into package.json;
and the host itself over gRPC, started by its launcher as the CLI starts it. The real CLI, npm
and node run it end to end in tests/e2e/test_typescript_package.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import language_pb2, language_pb2_grpc

from tools import langhost, toolchain
from tools import langhost_nodejs as host_mod


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


# ---- runtime options


def test_typescript_is_on_unless_the_option_turns_it_off() -> None:
    assert host_mod.parse_options({}).typescript is True
    assert host_mod.parse_options({"typescript": False}).typescript is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"typescript": "yes"}, "typescript option must be a boolean"),
        ({"tsconfig": 1}, "tsconfigpath option must be a string"),
        ({"nodeargs": True}, "nodeargs option must be a string"),
        ({"production": "no"}, "production option must be a boolean"),
        ({"packagemanager": 1}, "packagemanager option must be a string"),
        (
            {"packagemanager": "npx"},
            'packagemanager option must be one of auto, npm, yarn, pnpm or bun, got "npx"',
        ),
    ],
)
def test_bad_options_fail_with_the_official_messages(options: dict[str, Any], message: str) -> None:
    with pytest.raises(host_mod.HostError) as caught:
        host_mod.parse_options(options)
    assert str(caught.value) == message


def test_another_package_manager_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(host_mod.HostError, match=r"packagemanager yarn .* use npm"):
        host_mod.package_manager(host_mod.parse_options({"packagemanager": "yarn"}), str(tmp_path))
    (tmp_path / "pnpm-lock.yaml").write_text("")
    with pytest.raises(host_mod.HostError, match="packagemanager pnpm"):
        host_mod.package_manager(host_mod.parse_options({}), str(tmp_path))


def test_npm_is_chosen_by_auto_and_by_name(tmp_path: Path) -> None:
    assert host_mod.package_manager(host_mod.parse_options({}), str(tmp_path)) == "npm"
    named = host_mod.parse_options({"packagemanager": "npm"})
    assert host_mod.package_manager(named, str(tmp_path)) == "npm"


def test_install_is_npm_install_as_the_official_host_runs_it() -> None:
    assert host_mod.install_command(host_mod.parse_options({})) == [
        "npm",
        "install",
        "--loglevel=error",
    ]
    production = host_mod.parse_options({"production": True})
    assert host_mod.install_command(production)[-1] == "--production"


# ---- Run


def _run_request(**fields: Any) -> Any:
    info = language_pb2.ProgramInfo(
        root_directory="/p", program_directory="/p/prog", entry_point="."
    )
    base: dict[str, Any] = {
        "monitor_address": "127.0.0.1:1",
        "project": "proj",
        "stack": "dev",
        "organization": "org",
        "parallel": 8,
        "info": info,
    }
    return language_pb2.RunRequest(**{**base, **fields})


def test_run_passes_the_official_flags_in_order() -> None:
    args = host_mod.run_arguments(_run_request(dryRun=True), "/run.js", "127.0.0.1:2", "")
    assert args == [
        "/run.js",
        "--monitor", "127.0.0.1:1",
        "--engine", "127.0.0.1:2",
        "--organization", "org",
        "--project", "proj",
        "--root-directory", "/p",
        "--stack", "dev",
        "--pwd", "/p/prog",
        "--dry-run",
        "--parallel", "8",
        ".",
    ]  # fmt: skip
    assert "--dry-run" not in host_mod.run_arguments(_run_request(), "/run.js", "e", "")


def test_run_passes_config_in_the_old_key_form_and_the_typescript_switch() -> None:
    req = _run_request(
        config={"kubernetes:enableSecretMutable": "true", "pmem-csi:x": "1"},
        configSecretKeys=["pmem-csi:x"],
    )
    env = host_mod.run_environment(req, host_mod.parse_options({"tsconfig": "t.json"}), {})
    assert json.loads(env["PULUMI_CONFIG"]) == {
        "kubernetes:config:enableSecretMutable": "true",
        "pmem-csi:config:x": "1",
    }
    assert json.loads(env["PULUMI_CONFIG_SECRET_KEYS"]) == ["pmem-csi:x"]
    assert env["PULUMI_NODEJS_TYPESCRIPT"] == "true"
    assert env["PULUMI_NODEJS_TSCONFIG_PATH"] == "t.json"
    plain = host_mod.run_environment(req, host_mod.parse_options({"typescript": False}), {})
    assert "PULUMI_NODEJS_TYPESCRIPT" not in plain


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        (0, ("", False)),
        (32, ("", True)),
        (1, ("Program exited with non-zero exit code: 1", False)),
        (-9, ("Program exited unexpectedly (signal 9)", False)),
    ],
)
def test_exit_codes_are_answered_as_the_official_host_does(
    code: int, answer: tuple[str, bool]
) -> None:
    assert host_mod.exit_status_response(code) == answer


def test_without_the_sdk_run_says_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(host_mod.HostError, match="Have you run npm install"):
        host_mod.locate_run_module(str(tmp_path), os.environ)


# ---- GetRequiredPackages


def test_required_packages_are_the_resource_packages_under_node_modules(tmp_path: Path) -> None:
    nm = tmp_path / "node_modules"
    k8s = {"name": "@pulumi/kubernetes", "version": "4.25.0", "pulumi": {"resource": True}}
    _write(nm / "@pulumi/kubernetes/package.json", k8s)
    _write(nm / "@pulumi/pulumi/package.json", {"name": "@pulumi/pulumi", "version": "3.276.0"})
    # A third-party package without pulumi.name: skipped (the official host logs it).
    _write(nm / "other/package.json", {"name": "other", "version": "1.0.0",
                                       "pulumi": {"resource": True}})  # fmt: skip
    # A linked SDK (npm's file: dependency is a symlink), its plugin named and versioned.
    sdk = _write(tmp_path / "sdks/pmem-csi/package.json", {
        "name": "@pulumi/pmem-csi", "version": "0.1.0",
        "pulumi": {"resource": True, "name": "pmem-csi", "version": "v0.1.0", "server": "s"},
    })  # fmt: skip
    (nm / "@pulumi/pmem-csi").symlink_to(sdk.parent)
    # A package.json outside any node_modules is the program's own, not a dependency.
    _write(tmp_path / "package.json", {"name": "@pulumi/prog", "pulumi": {"resource": True}})
    assert sorted(host_mod.required_packages(str(tmp_path))) == [
        ("kubernetes", "v4.25.0", ""),
        ("pmem-csi", "v0.1.0", "s"),
    ]


# ---- Link


def test_link_adds_the_sdk_as_a_file_dependency_allowed_to_run_its_postinstall(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "package.json",
           {"name": "prog", "allowScripts": {"file:other": True}})  # fmt: skip
    _write(tmp_path / "tsconfig.json", {})
    _write(tmp_path / "sdks/pmem-csi/package.json", {"name": "@pulumi/pmem-csi"})
    text = host_mod.link_packages(str(tmp_path), [("pmem-csi", "sdks/pmem-csi")])
    manifest = json.loads((tmp_path / "package.json").read_text())
    assert manifest["dependencies"] == {"@pulumi/pmem-csi": "file:sdks/pmem-csi"}
    assert manifest["allowScripts"] == {"file:other": True, "file:sdks/pmem-csi": True}
    assert text == (
        "You can import the SDK in your TypeScript code with:\n\n"
        '  import * as pmemCsi from "@pulumi/pmem-csi";\n'
    )


def test_link_of_a_javascript_project_answers_with_require() -> None:
    text = host_mod.import_instructions([("pmem-csi", "@pulumi/pmem-csi")], typescript=False)
    assert text.endswith('  const pmemCsi = require("@pulumi/pmem-csi");\n')
    assert text.startswith("You can import the SDK in your JavaScript code with:")


def test_link_without_a_generated_sdk_names_its_path(tmp_path: Path) -> None:
    _write(tmp_path / "package.json", {"name": "prog"})
    with pytest.raises(host_mod.HostError, match="SDK at sdks/none"):
        host_mod.link_packages(str(tmp_path), [("none", "sdks/none")])


# ---- the host over gRPC, started by its launcher


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A running host (its launcher, as the CLI starts it) with a call log."""
    bin_dir = tmp_path_factory.mktemp("nodejs-host")
    missing = bin_dir / "no-codegen"
    launcher = host_mod.install(bin_dir, missing)
    log = bin_dir / "calls.log"
    env = {**os.environ, langhost.CALL_LOG_ENV: str(log)}
    proc = subprocess.Popen(
        [str(launcher), "127.0.0.1:1"], cwd=bin_dir, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield language_pb2_grpc.LanguageRuntimeStub(channel), log
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_host_reports_the_cli_version_and_logs_its_calls(host: tuple[Any, Path]) -> None:
    stub, log = host
    assert stub.GetPluginInfo(empty_pb2.Empty(), timeout=60).version == host_mod.VERSION
    assert "nodejs:GetPluginInfo" in log.read_text().split()


def test_get_required_plugins_is_unimplemented_as_in_the_official_host(
    host: tuple[Any, Path],
) -> None:
    stub, _ = host
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetRequiredPlugins(language_pb2.GetRequiredPluginsRequest(), timeout=60)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_generate_package_without_the_code_generator_says_how_to_build_it(
    host: tuple[Any, Path], tmp_path: Path
) -> None:
    stub, _ = host
    with pytest.raises(grpc.RpcError) as caught:
        stub.GeneratePackage(
            language_pb2.GeneratePackageRequest(directory=str(tmp_path), schema="{}"), timeout=60
        )
    assert "python -m tools.toolchain build pulumi-nodejs" in caught.value.details()


def test_a_bad_option_fails_link_with_the_official_message(
    host: tuple[Any, Path], tmp_path: Path
) -> None:
    stub, _ = host
    options = struct_pb2.Struct()
    options.update({"typescript": "yes"})
    info = language_pb2.ProgramInfo(
        root_directory=str(tmp_path), program_directory=str(tmp_path), options=options
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.Link(language_pb2.LinkRequest(info=info), timeout=60)
    assert caught.value.details() == "typescript option must be a boolean"


# ---- the code generator is the CLI's


def _module_lines(group: str) -> list[str]:
    text = (toolchain.TOOLS_DIR / group / "go.mod").read_text()
    return [line for line in text.splitlines() if line and not line.startswith(("//", "module "))]


def test_the_code_generator_is_built_from_the_clis_module_versions() -> None:
    # The same requirements, replace lines and sums as the CLI's wrapper module: the SDK the
    # stand-in generates is the one the CLI v3.276.0's own pkg/v3/codegen/nodejs writes.
    assert _module_lines("pulumi-nodejs") == _module_lines("pulumi")
    tools = toolchain.TOOLS_DIR
    assert (tools / "pulumi-nodejs/go.sum").read_text() == (tools / "pulumi/go.sum").read_text()
    group = toolchain.GROUPS["pulumi-nodejs"]
    assert group.packages == {host_mod.CODEGEN_BINARY: "."}
    assert group.tags == toolchain.GROUPS["pulumi"].tags
    main = (tools / "pulumi-nodejs/main.go").read_text()
    assert '"github.com/pulumi/pulumi/pkg/v3/codegen/nodejs"' in main
    assert toolchain.PULUMI_VERSION.lstrip("v") == host_mod.VERSION


def test_the_typescript_section_has_the_one_example_the_e2e_test_type_checks() -> None:
    # Without a cluster: the section stays where tests/e2e/test_typescript_package.py reads it.
    from tests.e2e.test_typescript_package import doc_typescript_example

    example = doc_typescript_example()
    assert 'from "@pulumi/pmem-csi"' in example
    assert "new pmemCsi.PmemCsiDeployment(" in example


def test_link_without_npm_names_npm(tmp_path, monkeypatch) -> None:
    """No npm on the PATH: Link says so, not a bare FileNotFoundError (review of ts19)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(host_mod.HostError, match="could not find npm on the \\$PATH"):
        host_mod.link_packages(str(tmp_path), [("pmem-csi", str(tmp_path / "sdk"))])
