"""The first run's pieces that need no machine: the check's report (expected and seen, the live
state, the Prometheus textfile), the plan's text, the preflight's script against fake tools,
and the CLI's refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from prometheus_client.parser import text_string_to_metric_families
from scenario_support import LocalShell, good_snapshot

from vmtests.cli import main
from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.settings import Settings
from vmtests.contracts.status import ExitStatus, RunStatus
from vmtests.driver.machine import CommandResult, Machine
from vmtests.profiles import load_profile
from vmtests.report import markdown_summary, scenario_data, write_prometheus
from vmtests.scenario.install.generations import DryRun, Generation
from vmtests.scenario.install.switching import CommandSwitch, Switcher
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.runner.preflight import required_tools, run_preflight
from vmtests.scenario.runner.recovery import OnFailure
from vmtests.scenario.runner.run_plan import RunPlan, render_run_plan
from vmtests.scenario.runner.scenario import CHECK, Kind, ScenarioResult
from vmtests.scenario.runner.versions import NIXOS_SYSTEM_BIN

CFX = load_profile("cfx-llm2")


def _check_result(profile_name: str) -> ScenarioResult:
    snapshot = good_snapshot(label=CHECK)
    profile = load_profile(profile_name)
    result = ScenarioResult(profile, "ssh://root@cfx-llm2", "none (read-only)", kind=Kind.CHECK)
    result.snapshots = {CHECK: snapshot}
    result.checks = evaluate_stage(profile, snapshot)
    result.status = RunStatus.FINISHED
    return result


def test_the_check_report_shows_expected_and_seen_for_every_row() -> None:
    conforming = markdown_summary(_check_result("cfx-llm2"))
    assert conforming.startswith("# vmtests check: cfx-llm2 on ssh://root@cfx-llm2: CONFORMS")
    assert (
        "| --mamba-cache-mode | argv has `--mamba-cache-mode align` | "
        "`--mamba-cache-mode align` | pass |" in conforming
    )
    failing = _check_result("baseline")
    text = markdown_summary(failing)
    assert "DOES NOT CONFORM" in text
    assert (
        "| --enable-prefix-caching | argv lacks `--enable-prefix-caching` | "
        "`--enable-prefix-caching` | FAIL |" in text
    )
    assert (
        "| QWEN36_MERGE_BATCH_GUARD | env lacks `QWEN36_MERGE_BATCH_GUARD` | "
        "`QWEN36_MERGE_BATCH_GUARD=1` | FAIL |" in text
    )
    assert (
        "| prefix-caching | module banner `prefix-caching=off` | `prefix-caching=on` | FAIL |"
        in text
    )
    assert "## Live state" in text
    assert (
        "- `(APIServer pid=594) INFO 11-30 01:33:58 [api_server.py:1] qwen36: SDPA streaming "
        "ACTIVE`" in text
    )
    data = scenario_data(failing)
    assert data["kind"] == "check"
    seen = {row["subject"]: row["seen"] for row in data["expected_and_seen"]}
    assert seen["enable_prefix_caching"] == "`enable_prefix_caching=True`"
    assert data["live_state"]["argv"].startswith("/usr/bin/python3 -m vmtests.stub.server")


def test_the_prometheus_textfile_parses(tmp_path: Path) -> None:
    result = _check_result("baseline")
    path = write_prometheus(result, tmp_path / "textfile" / "vmtests.prom")
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    (verdict,) = families["vmtests_check_ok"].samples
    assert verdict.value == 0
    assert verdict.labels == {"profile": "baseline", "target": "ssh://root@cfx-llm2"}
    (failures,) = families["vmtests_check_failures"].samples
    assert failures.value == len(result.failures) > 0
    passed = {
        (s.labels["check"], s.labels["subject"]): s.value
        for s in families["vmtests_check_passed"].samples
    }
    assert passed[("profile.args", "--enable-prefix-caching")] == 0
    assert passed[("service.active", "tenstorrent-serving.service")] == 1


def test_the_plan_names_every_step_command_and_the_downtime() -> None:
    generation = Generation(
        "/nix/store/abc-nixos-system-cfx-llm2", "/nix/store/abc (generation 41)",
        "nix-env -p /nix/var/nix/profiles/system --switch-generation 41 && ...", "readlink",
    )  # fmt: skip
    settings = Settings().overridden({"ready_timeout": "3600"}, "target option")
    plan = RunPlan(
        CFX, "ssh://root@cfx-llm2", "switch command: nixos-rebuild switch --flake /etc/nixos#x",
        settings, OnFailure.ROLLBACK, None, deploys_base=False, generation=generation,
    )  # fmt: skip
    text = render_run_plan(plan)
    assert "1. connect to ssh://root@cfx-llm2" in text
    # Every preflight refusal is announced, tt-smi's version and the serving unit's state too.
    assert "their versions, tt-smi >= 3.0.5;" in text
    assert "tenstorrent-serving.service runs;" in text
    assert "switch: switch command: nixos-rebuild switch --flake /etc/nixos#x" in text
    assert "roll back with `nix-env -p /nix/var/nix/profiles/system --switch-generation 41" in text
    assert "at most 3780 s (stop_timeout + ready_timeout)" in text
    assert "ready_timeout=3600 s (target option)" in text
    left = render_run_plan(RunPlan(CFX, "t", "s", Settings(), OnFailure.LEAVE, None, True))
    assert "leave the host as it is; the command that goes back" in left


class _Switch:
    description = "fake"

    def __init__(self, dry: DryRun) -> None:
        self.dry = dry

    def dry_run(self, machine: Machine, profile: object) -> DryRun:
        return self.dry


TOOLS = ("systemctl", "journalctl", "curl", "tt-smi", "docker")


def _fake_tools(
    directory: Path,
    unit_state: str = "active running",
    tt_smi_version: str = "6.2.1",
    jobs: str = "",
) -> str:
    """Fakes of TOOLS in ``directory``, the serving unit in ``unit_state`` (ActiveState
    SubState) with systemd's ``jobs`` (``list-jobs`` lines), tt-smi saying ``tt_smi_version``;
    the PATH that finds them first."""
    active, sub = unit_state.split()
    scripts = {
        "tt-smi": f"echo {tt_smi_version}",
        "docker": "echo 26.1.5",  # the daemon's version (versions.VERSION_COMMANDS)
        "systemctl": f"""case $1 in show) printf 'ActiveState={active}\\nSubState={sub}\\n';;
  list-jobs) printf '%s' '{jobs}';;
  *) echo systemd 257 '(257.13)';; esac""",
        "curl": "printf 200",  # GET /v1/models answers 200
        "journalctl": "true",
    }
    for tool in TOOLS:
        path = directory / tool
        path.write_text(f"#!/bin/sh\n{scripts[tool]}\n")
        path.chmod(0o755)
    return f"{directory}:/usr/bin:/bin"


@pytest.mark.parametrize(
    ("dry", "switch", "refused", "why"),
    [
        (DryRun(True, True, "d"), "nixos-rebuild switch --flake /etc/nixos#{profile}",
         Reason.TOOL_MISSING, "missing on local: nixos-rebuild"),
        (DryRun(False, None, "no eval"), None, Reason.DOES_NOT_EVALUATE, "no eval"),
        (DryRun(True, False, "same"), None, Reason.SWITCH_CHANGES_NOTHING,
         "the switch would change nothing"),
        (DryRun(True, True, "d"), None, None, ""),
    ],
    ids=["tool-missing", "does-not-evaluate", "changes-nothing", "holds"],
)  # fmt: skip
def test_the_preflight_against_fake_tools(
    tmp_path: Path, dry: DryRun, switch: str | None, refused: Reason | None, why: str
) -> None:
    machine = cast(Machine, LocalShell(_fake_tools(tmp_path)))
    # A switch command names the program the run needs; else a fake with the given dry run.
    switcher = CommandSwitch(switch) if switch else cast(Switcher, _Switch(dry))
    found = run_preflight(machine, CFX, switcher, Settings())
    refusal = found.refusal
    if refused is None:
        # This host's memory and disk are whatever they are: only those may refuse.
        assert refusal is None or refusal.reason in {
            Reason.LOW_MEMORY, Reason.HUGEPAGES_DO_NOT_FIT, Reason.LOW_DISK,
        }, refusal  # fmt: skip
    else:
        assert refusal is not None
        assert (refusal.reason, why in refusal.message) == (refused, True), refusal
    assert all(item.check.startswith("preflight.") for item in found.items)
    assert found.versions["tt-smi"] == "6.2.1"
    assert "nixos-rebuild" in found.versions
    (hugepages,) = [item for item in found.items if item.check == Check.PREFLIGHT_HUGEPAGES]
    assert "the hugepages still to reserve" in hugepages.message


@pytest.mark.parametrize("unit_state", ["failed failed", "inactive dead"])
def test_a_serving_unit_that_does_not_run_is_refused_as_such(
    tmp_path: Path, unit_state: str
) -> None:
    """switch-to-configuration restarts only running units: from a failed or stopped one the
    dry run sees no restart, which is not "the switch changes nothing"."""
    machine = cast(Machine, LocalShell(_fake_tools(tmp_path, unit_state)))
    switcher = cast(Switcher, _Switch(DryRun(True, False, "would not restart")))
    found = run_preflight(machine, CFX, switcher, Settings())
    refusal = found.refusal
    assert refusal is not None
    # Memory and disk are this host's: the unit's item comes after them.
    if refusal.reason not in {Reason.LOW_MEMORY, Reason.HUGEPAGES_DO_NOT_FIT, Reason.LOW_DISK}:
        assert (refusal.check, refusal.reason) == (Check.PREFLIGHT_ACTIVE, Reason.NOT_ACTIVE)
    (unit,) = [item for item in found.items if item.check == Check.PREFLIGHT_ACTIVE]
    active, sub = unit_state.split()
    assert (unit.ok, unit.reason) == (False, Reason.NOT_ACTIVE)
    assert f"tenstorrent-serving.service is {active} ({sub}): it is not running" in unit.message
    assert "journalctl -b -u tenstorrent-serving.service" in unit.message
    assert Check.PREFLIGHT_RESTARTS not in {item.check for item in found.items}


def test_a_serving_unit_still_waiting_to_start_is_refused_with_its_job(tmp_path: Path) -> None:
    """Just after a boot the unit may be inactive with its start job queued (behind Docker):
    the refusal says to wait for it, not that the unit stopped."""
    job = "41 tenstorrent-serving.service start waiting\n"
    machine = cast(Machine, LocalShell(_fake_tools(tmp_path, "inactive dead", jobs=job)))
    switcher = cast(Switcher, _Switch(DryRun(True, False, "would not restart")))
    found = run_preflight(machine, CFX, switcher, Settings())
    (unit,) = [item for item in found.items if item.check == Check.PREFLIGHT_ACTIVE]
    assert (unit.ok, unit.reason) == (False, Reason.NOT_ACTIVE)
    assert "is inactive (dead) with start job 41 queued (waiting)" in unit.message
    assert "wait until `systemctl is-active tenstorrent-serving.service` says active" in (
        unit.message
    )
    assert "it is not running" not in unit.message


@pytest.mark.parametrize(
    ("version", "holds"),
    [("3.0.4", False), ("2.1.0", False), ("3.0.6", True), ("6.2.1+vmtests.stub", True)],
)
def test_a_tt_smi_that_prints_no_snapshot_on_stdout_is_refused(
    tmp_path: Path, version: str, holds: bool
) -> None:
    """tt-smi before 3.0.5 wrote ``-s`` to a file only (tt-smi CHANGELOG.md): the card check
    would read no snapshot, for a reason that has nothing to do with the settings."""
    machine = cast(Machine, LocalShell(_fake_tools(tmp_path, tt_smi_version=version)))
    switcher = cast(Switcher, _Switch(DryRun(True, True, "d")))
    found = run_preflight(machine, CFX, switcher, Settings())
    (item,) = [item for item in found.items if item.check == Check.PREFLIGHT_TT_SMI]
    assert (item.ok, item.reason) == (holds, None if holds else Reason.TOOL_TOO_OLD), item
    assert f"tt-smi {version}; the snapshot needs at least 3.0.5" in item.message
    if not holds:
        assert found.refusal == item  # before memory and disk, which are this host's
        assert "upgrade tt-smi on the host to 3.0.5 or later" in item.message


class _NixosShell(LocalShell):
    """A LocalShell whose NixOS system programs are in ``system_bin``, not on its PATH (as on
    a NixOS VM's backdoor, whose PATH is the tool manifest)."""

    def __init__(self, path: str, system_bin: Path) -> None:
        super().__init__(path)
        self.system_bin = system_bin

    def _run(self, command: str, timeout: float) -> CommandResult:
        return super()._run(command.replace(NIXOS_SYSTEM_BIN, str(self.system_bin)), timeout)


def test_nixos_rebuild_is_found_in_the_system_off_the_path(tmp_path: Path) -> None:
    system_bin = tmp_path / "sw" / "bin"
    system_bin.mkdir(parents=True)
    for tool, script in {
        "nixos-rebuild": "exit 1",
        "nixos-version": "echo '26.11.20260101 (X)'",
    }.items():
        (system_bin / tool).write_text(f"#!/bin/sh\n{script}\n")
        (system_bin / tool).chmod(0o755)
    path = _fake_tools(tmp_path)
    switcher = cast(Switcher, _Switch(DryRun(True, True, "d")))
    found = run_preflight(cast(Machine, _NixosShell(path, system_bin)), CFX, switcher, Settings())
    assert found.versions["nixos-rebuild"] == f"{system_bin}/nixos-rebuild 26.11.20260101 (X)"
    # Not NixOS: reported absent.
    elsewhere = _NixosShell(path, tmp_path / "none")
    absent = run_preflight(cast(Machine, elsewhere), CFX, switcher, Settings())
    assert absent.versions["nixos-rebuild"] == "-"


@pytest.mark.parametrize(
    ("command", "programs"),
    [
        ("sudo -n nixos-rebuild switch --flake /etc/nixos#h", {"nixos-rebuild"}),
        # flake.nix's prebuilt switch: both programs must be on the machine.
        (
            "nix-env -p /nix/var/nix/profiles/system --set /nix/store/x && "
            "systemd-run -E NIXOS_NO_CHECK --pipe /nix/store/x/bin/switch-to-configuration switch",
            {"nix-env", "systemd-run"},
        ),
        (
            "LANG=C env -i /run/current-system/sw/bin/nixos-rebuild switch",
            {"/run/current-system/sw/bin/nixos-rebuild"},
        ),
    ],
    ids=["sudo", "prebuilt", "env"],
)
def test_the_preflight_asks_for_every_program_of_the_switch(
    command: str, programs: set[str]
) -> None:
    tools = required_tools(Settings(), CommandSwitch(command))
    assert programs <= set(tools), tools
    assert not {"sudo", "env", "-n", "-i"} & set(tools), tools


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--profile", "baseline", "--target", "ssh://h", "--deploy", "cfx-llm2"],
         "--deploy applies to qemu:reference only"),
        (["run", "--profile", "cfx-llm2", "--target", "ssh://h", "--hw-opt-in",
          "--switch-command", "nixos-rebuild switch", "--reference-switch"], "exclude each other"),
        (["run", "--profile", "cfx-llm2", "--target", "ssh://h", "--switch-command", "x"],
         "pass --hw-opt-in"),
        (["check", "--profile", "baseline", "--target", "ssh://h?ready_timeout=soon"],
         "ready_timeout ($VMTESTS_READY_TIMEOUT) is 'soon'"),
    ],
    ids=["deploy-on-ssh", "two-switches", "no-opt-in", "bad-option"],
)  # fmt: skip
def test_usage_errors_exit_2_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == ExitStatus.USAGE
    assert message in capsys.readouterr().err


def test_a_report_json_carries_the_settings_preflight_and_recovery_fields(tmp_path: Path) -> None:
    result = _check_result("cfx-llm2")
    data = json.loads(json.dumps(scenario_data(result), default=str))
    assert data["settings"]["ready_timeout"] == {"value": "300 s", "source": "default"}
    assert data["preflight"] == []
    assert data["generation"] is None
    assert data["recovery"] is None
