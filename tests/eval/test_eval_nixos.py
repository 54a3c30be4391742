"""The full NixOS evaluation (vmtests.nixos_eval): every configuration, VM runner, check and app
instantiates, and the units NixOS really renders meet the instrumentation contract and the
hand-written expectations. One evaluation per session (the ``nixos`` fixture)."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from eval_support import configuration_mismatches, explain
from nixos_support import (
    ALL_CONFIGURATIONS,
    VM_CONFIGURATIONS,
    VM_TARGETS,
    container_argv,
    container_environment,
    exports_before,
    firewall_problems,
    forced_removals,
    graceful_before_removal,
    hugepages_fit,
    missing_python_packages,
    missing_tools,
    nixpkgs_input_problems,
    switch_command_lines,
    switch_commands,
)
from rendered_unit import RenderedUnit, rendered_unit

from vmtests import nixos_eval
from vmtests.cli import build_parser
from vmtests.contracts.instrumentation import (
    CONSOLE_LOG_LEVEL,
    GUEST_CPUS,
    GUEST_MEMORY_MB,
    GUEST_TOOLS,
    KERNEL_PARAMS,
)
from vmtests.contracts.paths import REPO_ROOT
from vmtests.contracts.serving import SERVING_CONTAINER, Hugepages
from vmtests.driver import accel, qemu_launch
from vmtests.nixos_eval import (
    NixosEvalUnavailable,
    describe,
    find_environment,
    is_trimmed,
)
from vmtests.profiles import load_profile
from vmtests.scenario.install.generations import (
    ACTIVATION_PREFIX,
    command_action,
    simple_commands,
)

pytestmark = pytest.mark.nix


def serving_configurations() -> list[str]:
    """Configurations that run the serving unit."""
    return list(ALL_CONFIGURATIONS)


def test_every_configuration_and_vm_runner_instantiates(nixos: dict[str, Any]) -> None:
    configurations = nixos["configurations"]
    assert set(configurations) == set(ALL_CONFIGURATIONS), sorted(configurations)
    for name, described in configurations.items():
        assert described["toplevel"].endswith(".drv"), (name, described["toplevel"])
    for name in VM_CONFIGURATIONS:
        assert str(configurations[name]["vm"]).endswith("-nixos-vm.drv"), name


def test_every_check_app_and_package_instantiates(nixos: dict[str, Any]) -> None:
    checks = nixos["checks"]
    expected = {"core-profiles", "cfx-llm2-evaluates", "vm-test-base-evaluates"}
    expected |= {f"{name}-evaluates" for name in VM_TARGETS}
    expected |= {f"persistence-{profile}" for profile in VM_TARGETS.values()}
    assert set(checks) == expected
    assert all(path.endswith(".drv") for path in checks.values()), checks
    assert set(nixos["apps"]) == {
        "persistence", "persistence-cfx-llm2", "persistence-resident",
        "shell", "shell-cfx-llm2", "shell-resident",
    }  # fmt: skip
    for name, derivations in nixos["apps"].items():
        assert derivations, f"app {name}'s program depends on no derivation"
        assert all(path.endswith(".drv") for path in derivations), (name, derivations)
    assert all(path.endswith(".drv") for path in nixos["packages"].values())
    assert nixos["devShells"]["default"].endswith(".drv")


def test_the_package_and_the_dev_shell_have_every_python_dependency(
    nixos: dict[str, Any],
) -> None:
    """nixpkgs' pythonRuntimeDepsCheckHook fails the package's build on any [project].dependencies
    entry that is not installed; the dev shell runs the suite, whose addopts pass ``-n``."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    required = pyproject["project"]["dependencies"]
    package = nixos["pythonDependencies"]["package"]
    assert missing_python_packages(required, package) == []
    # Negative control: the dependency the flake once left out is caught.
    without = [name for name in package if name != "prometheus-client"]
    assert missing_python_packages(required, without) == ["prometheus-client"]
    dev = list(required)
    if "-n" in pyproject["tool"]["pytest"]["ini_options"]["addopts"].split():
        dev.append("pytest-xdist")
    assert missing_python_packages(dev, nixos["pythonDependencies"]["devShell"]) == []


def test_a_failed_persistence_run_keeps_its_reports_and_fails_its_check(
    nixos: dict[str, Any],
) -> None:
    """The reports CI uploads (scripts/flake-check-reports) are built apart from the check."""
    reports = nixos["persistenceReports"]
    assert set(reports) == {f"persistence-{profile}" for profile in VM_TARGETS.values()}
    for name, described in reports.items():
        profile = name.removeprefix("persistence-")
        assert described["drv"].endswith(f"-vmtests-persistence-report-{profile}.drv"), described
        assert described["succeedOnFailure"] is True, name
        # A failed run is a successful build: from a binary cache it would never run again.
        assert described["allowSubstitutes"] is False, name
        assert {"kvm", "nixos-test"} <= set(described["features"]), name
        assert described["checkFeatures"] == [], name  # the check only reads the report


def readme_runner_memory(readme: str) -> tuple[int, int, int, int]:
    """(MB per VM, vCPUs per VM, VMs at once, GiB per VM) as README's runner section states them."""
    text = " ".join(readme.split())
    per_vm = re.search(r"boots one VM of \d+ GiB \((\d+) MB and (\d+) vCPUs", text)
    total = re.search(r"at least (\d+) x (\d+) GiB plus headroom", text)
    assert per_vm, "README does not say how much memory a persistence check's VM takes"
    assert total, "README does not say how much memory the Nix and KVM runner needs"
    return int(per_vm[1]), int(per_vm[2]), int(total[1]), int(total[2])


def test_readme_sizes_the_runner_for_every_persistence_vm_at_once(nixos: dict[str, Any]) -> None:
    """With max-jobs >= 2 Nix runs every persistence check at once, each booting the base VM."""
    resources = nixos["configurations"]["vm-test-base"]["resources"]
    stated = readme_runner_memory((REPO_ROOT / "README.md").read_text())
    vms = len(nixos["persistenceReports"])
    assert stated == (resources["memoryMB"], resources["cpus"], vms, resources["memoryMB"] // 1024)


def test_every_app_has_what_nix_flake_check_asks_for(nixos: dict[str, Any]) -> None:
    """Without meta.description `nix flake check` warns (Nix >= 2.26); an attribute other than
    type, program and meta is an error (Nix src/nix/flake.cc, checkApp)."""
    for name, app in nixos["appDefinitions"].items():
        assert set(app["attributes"]) <= {"type", "program", "meta"}, (name, app)
        assert app["description"], f"app {name} has no meta.description"
        assert not app["descriptionHasContext"], f"app {name}'s description names a store path"


def test_the_kvm_probe_opens_kvm_in_the_sandbox(nixos: dict[str, Any]) -> None:
    """scripts/nix-kvm-preflight's probe: a build that goes where the persistence reports go
    (their system features, read from the flake and nothing more of it: nixos-eval.nix throws
    on the rest), named by its stamp so that every run builds anew, and that succeeds once it
    runs, writing whether it could open /dev/kvm read-write."""
    probe = nixos["kvmProbe"]
    assert probe["drv"].endswith("-vmtests-kvm-probe-eval.drv"), probe
    reports = nixos["persistenceReports"].values()
    assert {feature for report in reports for feature in report["features"]} == set(
        probe["features"]
    ), probe
    assert len(probe["features"]) == len(set(probe["features"])), probe
    command = probe["buildCommand"]
    assert "if [ -c /dev/kvm ] && { exec 3<>/dev/kvm; } 2>/dev/null; then" in command, command
    assert 'echo "$verdict $(stat -c %a /dev/kvm 2>/dev/null || echo absent)" > $out' in command
    assert "exit 1" not in command, command


def test_the_formatter_is_nixfmt_not_its_deprecated_alias(nixos: dict[str, Any]) -> None:
    assert nixos["formatter"].endswith("-nixfmt.drv"), nixos["formatter"]
    deprecated = [warning for warning in nixos["warnings"] if "nixfmt-rfc-style" in warning]
    assert not deprecated, deprecated


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_backdoor_path_covers_the_tool_manifest(nixos: dict[str, Any], name: str) -> None:
    described = nixos["configurations"][name]
    backdoor = rendered_unit(name, "backdoor")
    assert set(described["toolPackages"]) == set(GUEST_TOOLS)
    missing = missing_tools(backdoor.path, described["toolPackages"])
    assert not missing, f"{name}: the backdoor's PATH lacks {missing}: {backdoor.path}"


@pytest.mark.usefixtures("nixos")  # skips, naming the set-up step, without a nixpkgs tree
@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_a_switch_never_restarts_the_backdoor(name: str) -> None:
    """The backdoor's shell runs the switch: switch-to-configuration must leave it alone."""
    settings = rendered_unit(name, "backdoor").settings
    assert settings.get("X-RestartIfChanged") == ["false"], settings


def test_a_path_without_the_manifest_packages_is_caught(nixos: dict[str, Any]) -> None:
    """Negative control: nixpkgs' default service PATH (systemd-lib.nix) misses the manifest."""
    described = nixos["configurations"]["vm-test-cfx-llm2"]
    packages = described["toolPackages"]
    default_path = [
        f"{packages[program]}/bin"
        for program in ("cat", "bash", "find", "grep", "sed", "systemctl")
    ]
    missing = missing_tools(default_path, packages)
    assert {"curl", "ss", "setsid", "docker", "nix-env"} <= set(missing), missing


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_kernel_gets_the_contract_console_level(nixos: dict[str, Any], name: str) -> None:
    described = nixos["configurations"][name]
    assert described["consoleLogLevel"] == CONSOLE_LOG_LEVEL
    params = described["kernelParams"]
    missing = [param for param in KERNEL_PARAMS if param not in params]
    assert not missing, f"{name}: kernel parameters lack {missing}: {params}"
    # kernel.nix adds loglevel=<consoleLogLevel>; no other loglevel may override it.
    assert [p for p in params if p.startswith("loglevel=")] == [f"loglevel={CONSOLE_LOG_LEVEL}"]


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_serving_port_is_open_in_the_firewall(nixos: dict[str, Any], name: str) -> None:
    """The driver asks /health through the forwarded port, from outside the VM (slirp): the
    firewall NixOS turns on by default must admit it."""
    described = nixos["configurations"][name]
    assert described["firewall"]["enable"]  # NixOS' default: the check below is not idle
    assert firewall_problems(described) == []


def test_production_keeps_its_firewall_closed_to_the_serving_port(nixos: dict[str, Any]) -> None:
    """vLLM runs without an API key: the production host opens nothing the owner did not ask
    for (the module's openFirewall defaults to false)."""
    described = nixos["configurations"]["cfx-llm2"]
    assert described["firewall"]["enable"]
    assert described["serving"]["openFirewall"] is False
    assert firewall_problems(described) != []


def test_a_closed_serving_port_is_caught() -> None:
    closed = {"serving": {"port": 8000}, "firewall": {"enable": True, "allowedTCPPorts": [22]}}
    (problem,) = firewall_problems(closed)
    assert "not the serving port 8000" in problem
    assert firewall_problems({**closed, "firewall": {"enable": False}}) == []


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_vm_resources_come_from_the_contract_and_fit_the_hugepages(
    nixos: dict[str, Any], name: str
) -> None:
    described = nixos["configurations"][name]
    resources = described["resources"]
    assert (resources["memoryMB"], resources["cpus"]) == (GUEST_MEMORY_MB, GUEST_CPUS)
    hugepages = described["serving"]["hugepages"]
    assert hugepages_fit(resources["memoryMB"], hugepages["count"], hugepages["size"]), (
        f"{name}: {hugepages} do not fit in {resources['memoryMB']} MB"
    )


def test_the_hugepage_check_rejects_a_vm_too_small(nixos: dict[str, Any]) -> None:
    """Negative control: the old 4096 MB VM fails hosts/vm-test/common.nix's assertion, and the
    Python rule agrees."""
    messages = [m for m in nixos["smallVmAssertions"] if "hugepages reserve" in m]
    assert messages, nixos["smallVmAssertions"]
    assert "resources.memoryMB" in messages[0]
    assert not hugepages_fit(4096, 2, "1G")


def test_other_writers_of_the_hugepage_pool_are_refused_or_warned(nixos: dict[str, Any]) -> None:
    """boot.kernel.sysfs setting the reserved pool races the reservation: an assertion says what
    to change; boot.kernel.sysctl."vm.nr_hugepages" is warned about; the reservation runs after
    systemd-sysctl.service, so that its count is the last word."""
    assert nixos["configurations"]["vm-test-cfx-llm2"]["serving"]["hugepages"]["size"] == "1G"
    writers = nixos["otherHugepageWriters"]
    assert writers["none"]["assertions"] == []
    (message,) = writers["samePool"]["assertions"]
    assert (
        "boot.kernel.sysfs.kernel.mm.hugepages.hugepages-1048576kB.nr_hugepages (4) writes"
        in message
    )
    assert "set services.tenstorrent-serving.hugepages.count instead" in message
    (per_node,) = writers["perNode"]["assertions"]
    assert (
        "boot.kernel.sysfs.devices.system.node.node0.hugepages.hugepages-1048576kB.nr_hugepages "
        '(2), boot.kernel.sysfs.devices.system.node."node[1-3]".hugepages."hugepages-*"'
        ".nr_hugepages (1), boot.kernel.sysfs.kernel.mm.hugepages.hugepages-1048576kB"
        ".nr_hugepages_mempolicy (false) write the pool"
    ) in per_node
    assert "remove those boot.kernel.sysfs settings" in per_node
    assert writers["otherPool"]["assertions"] == []
    assert writers["sysctl"]["assertions"] == []
    (warning,) = set(writers["sysctl"]["warnings"]) - set(writers["none"]["warnings"])
    assert 'boot.kernel.sysctl."vm.nr_hugepages" (16)' in warning
    assert "systemd-sysctl.service" in rendered_unit("vm-test-cfx-llm2", "hugepages").values(
        "After"
    )


def test_container_settings_the_pre_start_replacement_would_ignore_are_refused(
    nixos: dict[str, Any],
) -> None:
    """oci-containers' pre-start logs in to a registry; the module's replaces it, so a login set
    for the serving container is refused by name, not dropped (the plain host has no failure:
    otherHugepageWriters.none)."""
    (message,) = nixos["containerLogin"]
    assert message.startswith(
        "virtualisation.oci-containers.containers.tenstorrent-serving.login would be ignored"
    ), message
    assert "services.tenstorrent-serving.imageFile" in message


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_vm_boots_like_production_and_grows_its_root(nixos: dict[str, Any], name: str) -> None:
    described = nixos["configurations"][name]
    production = nixos["configurations"]["cfx-llm2"]["bootLoader"]
    boot = described["bootLoader"]
    assert production["systemdBoot"]
    assert not production["grub"]
    assert boot["systemdBoot"]
    assert not boot["grub"]
    assert boot["efi"]
    assert boot["useBootLoader"]
    assert described["growRoot"] == {"growPartition": True, "autoResize": True}


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_suite_key_may_log_in(nixos: dict[str, Any], name: str) -> None:
    described = nixos["configurations"][name]
    assert described["sshd"]
    assert described["instrumented"]
    assert described["authorizedKeys"], f"{name}: root has no authorized key for the suite"


@pytest.mark.parametrize(("name", "profile"), VM_TARGETS.items())
def test_vm_targets_serve_exactly_like_the_production_host(
    nixos: dict[str, Any], name: str, profile: str
) -> None:
    configurations = nixos["configurations"]
    production, target = configurations["cfx-llm2"], configurations[name]
    # Only the device layer differs: the stub supplies the image (and loads it from a file).
    swapped = {"image", "imageFile"}
    differences = {
        key
        for key in set(production["serving"]) | set(target["serving"])
        if key not in swapped and production["serving"].get(key) != target["serving"].get(key)
    }
    # vm-test-resident runs the production host with its one profile line switched.
    allowed = {"deviceResident", "deviceArgmax"} if profile == "resident" else set()
    assert differences == allowed, {
        key: (production["serving"].get(key), target["serving"].get(key)) for key in differences
    }
    if not allowed:
        # The stub device layer also hands the container its fault knobs (an --env-file).
        device_layer = swapped | {"environmentFiles"}
        keep = {k: v for k, v in production["container"].items() if k not in device_layer}
        assert keep == {k: v for k, v in target["container"].items() if k not in device_layer}
        assert target["container"]["environmentFiles"] == ["/etc/vmtests-stub/knobs.env"]


@pytest.mark.parametrize("name", serving_configurations())
def test_the_rendered_serving_unit_meets_the_profile(nixos: dict[str, Any], name: str) -> None:
    described = nixos["configurations"][name]
    profile = load_profile(VM_TARGETS.get(name, "baseline" if name == "vm-test-base" else name))
    unit = rendered_unit(name)
    image = described["serving"]["image"]
    argv = unit.docker_run_argv
    assert argv[:2] == ["docker", "run"], argv
    (pre_start,) = unit.exec_start_pre
    assert pre_start.script is not None
    banner = pre_start.script.splitlines()[0]
    hugepages = described["serving"]["hugepages"]
    reserved = Hugepages(hugepages["count"], hugepages["size"]) if hugepages["count"] else None
    mismatches = configuration_mismatches(
        profile,
        container_argv(argv, image),
        container_environment(argv, image),
        banner,
        reserved,
    )
    assert not mismatches, f"{name}: the rendered unit breaks {profile.name}:\n" + explain(
        mismatches
    )


@pytest.mark.parametrize("name", serving_configurations())
def test_the_serving_unit_stops_gracefully_and_never_forces_removal(
    nixos: dict[str, Any], name: str
) -> None:
    stop_timeout = nixos["configurations"][name]["serving"]["stopTimeout"]
    unit = rendered_unit(name)
    assert f"--stop-timeout={stop_timeout}" in unit.docker_run_argv
    scripts = _exec_scripts(unit)
    assert not forced_removals(scripts), forced_removals(scripts)
    (pre_start,) = unit.exec_start_pre
    assert pre_start.script is not None
    assert graceful_before_removal(pre_start.script, "tenstorrent-serving", stop_timeout)
    (stop,) = unit.exec_stop
    assert stop.script is not None
    assert f"docker stop -t {stop_timeout}" in stop.script
    # ... and then waits for the attached `docker run` to exit before systemd SIGTERMs it.
    assert stop.script.index("docker stop") < stop.script.index('kill -0 "${MAINPID:-}"')
    assert int(str(unit.timeout_stop_sec)) > stop_timeout
    # oci-containers.nix's Restart=on-failure: a crashed server comes back.
    assert unit.restart in {"on-failure", "always"}, unit.restart


def test_nixpkgs_own_pre_start_would_be_caught() -> None:
    """Negative control: oci-containers.nix's pre-start and post-stop (`rm -f`) are flagged, and
    so is an ExecStartPre whose text is not one of the unit's job scripts."""
    nixpkgs_pre_start = "docker rm -f tenstorrent-serving || true\ndocker load -i image.tar\n"
    assert forced_removals({"pre-start": nixpkgs_pre_start})
    assert forced_removals({"post-stop": "docker container rm --force tenstorrent-serving"})
    assert forced_removals({"/nix/store/x-pre-start/bin/pre-start": None})
    assert not graceful_before_removal(nixpkgs_pre_start, "tenstorrent-serving", 60)


def _exec_scripts(unit: RenderedUnit) -> dict[str, str | None]:
    execs = [*unit.exec_start_pre, *unit.exec_stop, *unit.exec_stop_post]
    start = unit.exec_start
    if start is not None:
        execs.append(start)
    return {execution.command: execution.script for execution in execs}


def test_the_switch_runs_nixos_rebuild_offline_with_everything_in_the_image(
    nixos: dict[str, Any],
) -> None:
    base = nixos["configurations"]["vm-test-base"]
    for name in VM_TARGETS:
        assert nixos["configurations"][name]["toplevelOut"] in base["additionalPaths"], name
    assert nixos["flakeSource"] in base["additionalPaths"]
    assert nixos["nixpkgsSource"] in base["additionalPaths"]
    for name in VM_CONFIGURATIONS:
        assert nixos["configurations"][name]["substituters"] == [], name
    for profile in VM_TARGETS.values():
        script = nixos["persistenceScripts"][f"persistence-{profile}"]
        commands = switch_commands(script)
        assert set(commands) == {"rebuild", "prebuilt"}, script
        rebuild = commands["rebuild"]
        # By its path: the backdoor's PATH is the tool manifest, which has no nixos-rebuild.
        assert rebuild[:5] == [
            "/run/current-system/sw/bin/nixos-rebuild",
            "switch",
            "--no-reexec",
            "--flake",
            f"{nixos['flakeSource']}#vm-test-{profile}",
        ]
        pinned = rebuild.index("--override-input")
        assert rebuild[pinned + 1 : pinned + 3] == ["nixpkgs", f"path:{nixos['nixpkgsSource']}"]
        assert "--offline" in rebuild
        assert rebuild[rebuild.index("substituters") + 1] == ""
        toplevel = nixos["configurations"][f"vm-test-{profile}"]["toplevelOut"]
        # The profile is set, then the toplevel activated under systemd-run as the rollback
        # activates (generations.ACTIVATION_PREFIX).
        prebuilt = simple_commands(switch_command_lines(script)["prebuilt"])
        assert prebuilt == [
            ["nix-env", "-p", "/nix/var/nix/profiles/system", "--set", toplevel],
            [*shlex.split(ACTIVATION_PREFIX), f"{toplevel}/bin/switch-to-configuration", "switch"],
        ], prebuilt
        assert "${VMTESTS_SWITCH:-rebuild}" in script


def test_the_shell_app_brings_the_same_vm_to_a_stage_with_the_same_switch(
    nixos: dict[str, Any],
) -> None:
    """``nix run .#shell``: ``vmtests shell`` on the persistence job's VM, with its switches, its
    expected system and container, at S1 unless the arguments passed through say otherwise."""
    for profile in VM_TARGETS.values():
        shell = nixos["shellScripts"][f"shell-{profile}"]
        persistence = nixos["persistenceScripts"][f"persistence-{profile}"]
        assert switch_command_lines(shell) == switch_command_lines(persistence), shell
        assert "${VMTESTS_SWITCH:-rebuild}" in shell
        (command,) = [line for line in _joined_lines(shell) if line.startswith("exec ")]
        (run,) = [line for line in _joined_lines(persistence) if line.startswith("exec ")]
        words, run_words = shlex.split(command), shlex.split(run)
        assert words[1].endswith("/bin/vmtests"), command
        assert words[1] == run_words[1], (command, run)
        assert words[2] == "shell", command
        assert words[-3:] == ["--stage", "S1", "$@"], command
        scenario = run_words[3 : run_words.index("--report-dir")]
        assert words[3:-3] == scenario, (command, run)
        assert {"--profile", "--target", "--switch-command", "--expected-system"} <= set(scenario)
        assert scenario[scenario.index("--profile") + 1] == profile
        # What vmtests shell itself makes of the line (the switch as the case block sets it).
        args = build_parser().parse_args([word.replace("$switch", "true") for word in words[2:-1]])
        assert (args.command, args.profile, args.stage) == ("shell", profile, "S1")
        assert (args.container, args.switch_command) == (SERVING_CONTAINER, "true")
        assert args.target.startswith("qemu-nixos:/nix/store/"), args.target
        for text in (shell, persistence):  # the eval tier never builds them: bash reads them
            checked = subprocess.run(
                ["bash", "-n"], input=text, capture_output=True, text=True, timeout=30, check=False
            )
            assert checked.returncode == 0, checked.stderr
        # What belongs to the app is refused before anything runs.
        refused = subprocess.run(
            ["bash", "-c", shell, "shell", "--stage", "S2", "--profile=resident"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "--profile=resident is set by the app" in refused.stderr


def _joined_lines(script: str) -> list[str]:
    """The script's lines with backslash-newline continuations joined, each stripped."""
    return [line.strip() for line in script.replace("\\\n", " ").splitlines()]


def test_the_preflight_dry_runs_the_activation_of_each_switch(nixos: dict[str, Any]) -> None:
    """The preflight's dry run of the flake's own switches: dry-build and dry-activate of the
    rebuild, the activation alone (not the profile's ``nix-env --set``) of the prebuilt."""
    for profile in VM_TARGETS.values():
        lines = switch_command_lines(nixos["persistenceScripts"][f"persistence-{profile}"])
        toplevel = nixos["configurations"][f"vm-test-{profile}"]["toplevelOut"]
        dry = command_action(lines["prebuilt"], "switch-to-configuration", "dry-activate")
        assert dry is not None, lines["prebuilt"]
        assert dry.endswith(f"{toplevel}/bin/switch-to-configuration dry-activate"), dry
        assert "nix-env" not in dry, dry
        assert "&&" not in dry, dry
        rebuild = command_action(lines["rebuild"], "nixos-rebuild", "dry-build")
        assert rebuild is not None, lines["rebuild"]
        assert " dry-build --no-reexec --flake " in rebuild, rebuild


def test_a_switch_that_would_build_fails_at_once_and_the_report_names_the_system(
    nixos: dict[str, Any],
) -> None:
    """--max-jobs 0: a target that does not evaluate to the pre-built toplevel fails at once,
    naming the derivation, instead of building in the VM; the scenario is told which toplevel
    the switch must activate, so that its report says whether it did."""
    for profile in VM_TARGETS.values():
        script = nixos["persistenceScripts"][f"persistence-{profile}"]
        rebuild = switch_commands(script)["rebuild"]
        assert rebuild[rebuild.index("--max-jobs") + 1] == "0", rebuild
        toplevel = nixos["configurations"][f"vm-test-{profile}"]["toplevelOut"]
        assert f"--expected-system {toplevel} " in script, script


def test_the_flake_check_asks_for_kvm(nixos: dict[str, Any]) -> None:
    """The check's run (its report derivation, which requires the `kvm` feature) asks the driver
    for KVM: a builder that cannot open /dev/kvm fails with QEMU's own error instead of
    emulating into a timeout."""
    for profile in VM_TARGETS.values():
        report = nixos["persistenceReports"][f"persistence-{profile}"]
        assert "kvm" in report["features"]
        script = report["buildCommand"]
        exported = exports_before(script, f"-vmtests-persistence-{profile} ")
        assert exported.get("VMTESTS_ACCEL") == "kvm", script


@pytest.mark.parametrize("name", VM_CONFIGURATIONS)
def test_the_kvm_verdict_is_keyed_on_the_qemu_the_run_script_execs(
    nixos: dict[str, Any], name: str, tmp_path: Path
) -> None:
    """The run script's last command, as nixpkgs' qemu-vm.nix writes it, names the QEMU that
    keys the KVM verdict; it asks for `-machine accel=kvm:tcg` (a silent fallback), which the
    driver's later `-machine accel=kvm` overrides when KVM is asked for."""
    command = nixos["configurations"][name]["qemuCommand"]
    binary, *options = command.split()
    assert binary.startswith("/"), command
    assert binary.endswith("/bin/qemu-system-x86_64"), command
    assert options[:2] == ["-machine", "accel=kvm:tcg"], command
    assert qemu_launch.accel_args("kvm", machine_option=True)[:2] == ["-machine", "accel=kvm"]
    script = f'#! /bin/sh\n    cd "$TMPDIR"\n    exec {command} \\\n        -name {name} \\\n'
    assert accel.exec_line_qemu(script) == binary


def test_the_flake_follows_the_release_branch_of_the_evaluated_nixpkgs(
    nixos: dict[str, Any],
) -> None:
    """`nix flake check` must test the nixpkgs release this tier evaluated (README, "On a Nix
    host": the lock and the evaluated tree are kept in step)."""
    found = nixos["nixpkgsInput"]
    problems = nixpkgs_input_problems(found["url"], found["evaluatedRelease"], found["locked"])
    assert not problems, problems


def test_a_flake_input_off_the_evaluated_release_is_caught() -> None:
    """Negative control: the old `nixos-unstable`, another release, another repository, and a
    lock taken from another input each fail the comparison."""
    (unstable,) = nixpkgs_input_problems("github:NixOS/nixpkgs/nixos-unstable", "26.11", None)
    assert "follows nixos-unstable, but the evaluated nixpkgs is release 26.11" in unstable
    assert "follow nixos-26.11" in unstable
    assert nixpkgs_input_problems("github:NixOS/nixpkgs/nixos-26.05", "26.11", None)
    assert nixpkgs_input_problems("github:NixOS/nixpkgs", "26.11", None)
    assert nixpkgs_input_problems("github:example/nixpkgs/nixos-26.11", "26.11", None)
    assert nixpkgs_input_problems("path:/srv/nixpkgs", "26.11", None)
    assert not nixpkgs_input_problems("github:NixOS/nixpkgs?ref=nixos-26.11", "26.11", None)
    locked = {"owner": "NixOS", "repo": "nixpkgs", "ref": "nixos-26.11", "type": "github"}
    assert not nixpkgs_input_problems("github:NixOS/nixpkgs/nixos-26.11", "26.11", locked)
    (stale,) = nixpkgs_input_problems(
        "github:NixOS/nixpkgs/nixos-26.11", "26.11", {**locked, "ref": "nixos-unstable"}
    )
    assert "run `nix flake lock` and commit flake.lock" in stale


def test_the_shim_defines_no_option_the_project_sets(nixos: dict[str, Any]) -> None:
    for name, described in nixos["configurations"].items():
        for option, files in described["shimDefinitions"].items():
            ours = [
                f
                for f in files
                if (f.startswith((str(REPO_ROOT), "/src/")) and "/tests/eval/" not in f)
            ]
            assert not ours, f"{name}: the shim stubs {option}, which {ours} define"


def test_the_api_describes_one_configuration(nixos: dict[str, Any]) -> None:
    made = len(nixos_eval._CACHE)
    described = describe("vm-test-cfx-llm2")
    # The same description, from an evaluation already made in this process (the session's,
    # or a VM test's of that configuration alone): describe() evaluated nothing new.
    assert described == nixos["configurations"]["vm-test-cfx-llm2"]
    assert len(nixos_eval._CACHE) == made
    unit = rendered_unit("vm-test-cfx-llm2")
    start = unit.exec_start
    assert start is not None
    assert start.script is not None
    assert start.file_text().startswith("#!/bin/sh\nset -e\n\n")
    assert unit.environment["PATH"].split(":") == unit.path
    assert Path(start.program).name == "tenstorrent-serving-start"


def test_without_a_tree_the_reason_names_the_setup_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VMTESTS_NIXPKGS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no host Nix either
    with pytest.raises(NixosEvalUnavailable, match=r"run scripts/setup-nixos-eval"):
        find_environment()


def test_a_trimmed_tree_gets_the_shim_and_a_full_one_does_not(tmp_path: Path) -> None:
    modules = tmp_path / "nixos" / "modules"
    modules.mkdir(parents=True)
    (modules / "module-list.nix").write_text("[\n  ./hardware/steam-hardware.nix\n]\n")
    assert is_trimmed(tmp_path)
    (modules / "module-list.nix").write_text("[\n  ./hardware/tenstorrent.nix\n]\n")
    assert not is_trimmed(tmp_path)
