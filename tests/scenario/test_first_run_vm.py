"""The first run on a real host, proven on ONE reference guest, never a mock:

- ``vmtests check --target qemu:reference`` gives it the base configuration (baseline) deployed,
  restored from the snapshot cache (deployed and saved when the cache lacks it): it conforms to
  baseline, and the Prometheus file parses;
- reached over ``ssh://`` (its sshd) from then on, as a real host: ``check`` against cfx-llm2
  fails with the expected and seen values in its table; a target option and a host YAML set the
  ready timeout the report shows; ``run --plan`` changes nothing (same InvocationID); a switch
  that changes nothing is refused with exit 2; the API key path gives a clear 401 without the
  key and passes with it; a run whose S1 fails does not reboot, collects the evidence and rolls
  back to the recorded generation, and says so (journald dropping a chatty start's lines is a
  negative control: ``test_controls_vm.py``);
- then, from the base it was rolled back to, the persistence scenario of the selftest profiles
  after the first (``resident``; cfx-llm2's runs in ``test_controls_vm.py``).

One guest for all of it: the run is bound by the sum of the guests' work on two cores
(``docs/ci-time.md``), and another guest would cost a boot and a base deployment; every test
leaves the guest on the base configuration, serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from first_run_support import (
    API_KEY,
    CliRun,
    api_key_required,
    invocation_id,
    profile_expecting_more,
    report_table,
    run_cli,
    ssh_target,
)
from prometheus_client.parser import text_string_to_metric_families
from vm_support import assert_scenario_passed, run_scenario

from vmtests.cli import SELFTEST_PROFILES
from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.status import ExitStatus, RunStatus
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.targets import machine_from_target
from vmtests.scenario import prepared
from vmtests.scenario.install.generations import UNIT_SET_DIGEST
from vmtests.scenario.runner.recovery import Action

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(600)]


class BaseGuest(NamedTuple):
    """The guest, the first check's outcome, and where its report and textfile went."""

    machine: QemuMachine
    first_check: CliRun
    report: Path
    prometheus: Path
    state: Path


@pytest.fixture(scope="module")
def base_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseGuest]:
    """``vmtests check --profile baseline --target qemu:reference``: the guest it restores (or
    boots and deploys) is kept (instead of closed) for the module's other tests."""
    state = tmp_path_factory.mktemp("first-run")
    machine = machine_from_target("qemu:reference", state / "machine", name="first-run")
    assert isinstance(machine, QemuMachine)
    report, prometheus = state / "check-qemu", state / "check.prom"
    try:
        with pytest.MonkeyPatch.context() as patch:
            # The base deployment restored (or deployed and saved) into this machine.
            patch.setattr(prepared, "machine_from_target", lambda target, state_dir, **o: machine)
            patch.setattr(machine, "close", lambda: None)  # kept for the other tests
            first = run_cli(
                "check", "--profile", "baseline", "--target", "qemu:reference",
                "--report-dir", str(report), "--prometheus", str(prometheus),
            )  # fmt: skip
        yield BaseGuest(machine, first, report, prometheus, state)
    finally:
        machine.close()


def test_check_over_qemu_reference_deploys_the_base_and_conforms(base_guest: BaseGuest) -> None:
    first = base_guest.first_check
    assert first.status == 0, first.out + first.err
    assert "CONFORMS: qemu:reference against profile baseline" in first.out
    data = json.loads((base_guest.report / "report.json").read_text())
    assert data["kind"] == "check"
    assert data["ok"] is True
    assert "deploy" in data["steps"]
    assert not any(step.startswith(("switch", "reboot")) for step in data["steps"])
    markdown = (base_guest.report / "summary.md").read_text()
    assert markdown.startswith("# vmtests check: baseline on qemu:reference: CONFORMS")
    # The Prometheus textfile parses, with the verdict and one series per check.
    families = {
        family.name: family
        for family in text_string_to_metric_families(base_guest.prometheus.read_text())
    }
    (verdict,) = families["vmtests_check_ok"].samples
    assert verdict.value == 1
    assert verdict.labels == {"profile": "baseline", "target": "qemu:reference"}
    passed = families["vmtests_check_passed"].samples
    assert len(passed) == len(data["checks"])
    assert {sample.value for sample in passed} == {1}


def test_check_over_ssh_fails_for_cfx_llm2_with_expected_and_seen(base_guest: BaseGuest) -> None:
    machine = base_guest.machine
    before = invocation_id(machine)
    report = base_guest.state / "check-cfx"
    target = ssh_target(machine, base_guest.state, ready_timeout=4321)
    host_config = base_guest.state / "host.yaml"
    host_config.write_text("# cfx-llm2's settings\nready_timeout: 1234\nreboot_timeout: 900\n")
    found = run_cli(
        "check", "--profile", "cfx-llm2", "--target", target,
        "--host-config", str(host_config), "--report-dir", str(report),
    )  # fmt: skip
    assert found.status == 1, found.out + found.err
    assert "DOES NOT CONFORM" in found.out
    assert invocation_id(machine) == before  # read-only: nothing restarted
    rows = {row[0]: row for row in report_table(report / "summary.md", "## Expectations")}
    assert rows["--enable-prefix-caching"][1:] == [
        "argv has `--enable-prefix-caching`", "absent", "FAIL",
    ]  # fmt: skip
    assert rows["--no-enable-prefix-caching"][2:] == ["`--no-enable-prefix-caching`", "FAIL"]
    assert rows["QWEN36_MERGE_BATCH_GUARD"][2:] == ["unset", "FAIL"]
    assert rows["prefix-caching"][2:] == ["`prefix-caching=off`", "FAIL"]
    assert rows["enable_prefix_caching"][2:] == ["`enable_prefix_caching=False`", "FAIL"]
    markdown = (report / "summary.md").read_text()
    assert "## Live state" in markdown
    assert "tenstorrent-serving-config:" in markdown  # the banners of the current start
    # The target option beats the host's YAML, which beats the default; the report says so.
    settings = json.loads((report / "report.json").read_text())["settings"]
    assert settings["ready_timeout"] == {"value": "4321 s", "source": "target option"}
    assert settings["reboot_timeout"] == {
        "value": "900 s", "source": f"--host-config {host_config}",
    }  # fmt: skip
    assert "| ready_timeout | 4321 s | target option |" in markdown


def test_a_host_yaml_alone_sets_the_ready_timeout(base_guest: BaseGuest) -> None:
    report = base_guest.state / "check-yaml"
    host_config = base_guest.state / "host-only.yaml"
    host_config.write_text("ready_timeout: 1234\n")
    found = run_cli(
        "check", "--profile", "baseline",
        "--target", ssh_target(base_guest.machine, base_guest.state),
        "--host-config", str(host_config), "--report-dir", str(report),
    )  # fmt: skip
    assert found.status == 0, found.out + found.err
    settings = json.loads((report / "report.json").read_text())["settings"]
    assert settings["ready_timeout"] == {
        "value": "1234 s", "source": f"--host-config {host_config}",
    }  # fmt: skip


def test_plan_changes_nothing(base_guest: BaseGuest) -> None:
    machine = base_guest.machine
    before = invocation_id(machine), machine.boot_id()
    planned = run_cli(
        "run", "--plan", "--profile", "cfx-llm2", "--reference-switch",
        "--target", ssh_target(machine, base_guest.state, reboot_timeout=900),
    )  # fmt: skip
    assert planned.status == 0, planned.out + planned.err
    assert (invocation_id(machine), machine.boot_id()) == before
    out = planned.out
    assert "nothing is changed" in out
    assert "switch: reference install step" in out
    assert "reboot (at most 900 s" in out
    assert "roll back with the installed unit set" in out  # ssh://: rollback by default
    assert "downtime of tenstorrent-serving.service" in out
    assert "ok   restarts:" in out
    (tools,) = [line for line in out.splitlines() if "tools: found" in line]
    assert tools.startswith("  ok   tools: found systemd: "), tools
    assert "; tt-smi: 6.2.1+vmtests.stub" in tools, tools
    assert "; docker: " in tools, tools


def test_a_switch_that_changes_nothing_is_refused(base_guest: BaseGuest) -> None:
    machine = base_guest.machine
    before = invocation_id(machine)
    report = base_guest.state / "refused"
    refused = run_cli(
        "run", "--profile", "baseline", "--reference-switch", "--hw-opt-in",
        "--target", ssh_target(machine, base_guest.state), "--report-dir", str(report),
    )  # fmt: skip
    assert refused.status == ExitStatus.USAGE, refused.out + refused.err
    (line,) = [line for line in refused.err.splitlines() if "preflight refused" in line]
    assert f"({Check.PREFLIGHT_RESTARTS}, {Reason.SWITCH_CHANGES_NOTHING})" in line
    assert "the switch would change nothing" in line
    assert invocation_id(machine) == before
    data = json.loads((report / "report.json").read_text())
    assert data["status"] == RunStatus.REFUSED
    refusal = next(item for item in data["preflight"] if not item["ok"])
    assert (refusal["check"], refusal["reason"]) == (
        Check.PREFLIGHT_RESTARTS, Reason.SWITCH_CHANGES_NOTHING,
    )  # fmt: skip
    assert "S0" not in data["snapshots"]


@pytest.mark.nightly
def test_the_api_key_gives_a_clear_401_and_passes_with_its_file(base_guest: BaseGuest) -> None:
    machine = base_guest.machine
    with api_key_required(machine) as key_file:
        report = base_guest.state / "key"
        without = run_cli(
            "check", "--profile", "baseline", "--report-dir", str(report / "without"),
            "--target", ssh_target(machine, base_guest.state),
        )  # fmt: skip
        with_key = run_cli(
            "check", "--profile", "baseline", "--report-dir", str(report / "with"),
            "--target", ssh_target(machine, base_guest.state, api_key_file=key_file),
        )  # fmt: skip
    assert without.status == ExitStatus.FAILED
    models = json.loads((report / "without" / "report.json").read_text())["failures"]
    assert [(f["check"], f["reason"]) for f in models] == [
        (Check.SERVICE_MODELS, Reason.UNAUTHORIZED)
    ]
    assert "401 Unauthorized: the server requires an API key" in without.out
    assert "give the file on the host that holds it as the setting api_key_file" in without.out
    assert with_key.status == 0, with_key.out
    for path in (report / "with").rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(errors="replace"), path


@pytest.mark.nightly
def test_a_run_whose_s1_fails_rolls_back_to_the_recorded_generation(base_guest: BaseGuest) -> None:
    machine = base_guest.machine
    boot, generation = machine.boot_id(), machine.succeed(UNIT_SET_DIGEST).strip()
    report = base_guest.state / "rolled-back"
    profile = profile_expecting_more(base_guest.state, "this banner is never logged")
    ran = run_cli(
        "run", "--profile", str(profile), "--reference-switch", "--hw-opt-in",
        "--target", ssh_target(machine, base_guest.state), "--report-dir", str(report),
    )  # fmt: skip
    assert ran.status == 1, ran.out + ran.err
    data = json.loads((report / "report.json").read_text())
    assert [f["subject"] for f in data["failures"]] == ["never-logged"]
    assert data["stopped_at"] == "S1"
    assert machine.boot_id() == boot  # no reboot
    assert "S2" not in data["snapshots"]
    assert (report / "evidence/S1/journal-current-boot.txt").is_file()
    assert (report / "evidence/S1/systemd-analyze-time.txt").is_file()
    assert data["generation"]["id"] == generation
    recovery = data["recovery"]
    assert recovery["action"] == Action.ROLLED_BACK
    assert recovery["verified"] is True
    assert "rolled back to the recorded generation" in ran.out
    assert recovery["command"] in ran.out
    # The machine runs the unit set it ran before, and serves the base configuration again.
    assert machine.succeed(UNIT_SET_DIGEST).strip() == generation
    assert [c for c in data["checks"] if c["stage"] == "rollback" and not c["ok"]] == []
    check = run_cli(
        "check", "--profile", "baseline", "--report-dir", str(report / "after"),
        "--target", ssh_target(machine, base_guest.state),
    )  # fmt: skip
    assert check.status == 0, check.out


# Last: it reboots the guest, which the tests above do not expect. The nightly tier: the
# pre-merge tier runs cfx-llm2's scenario (test_controls_vm.py).
@pytest.mark.nightly
@pytest.mark.parametrize("profile_name", SELFTEST_PROFILES[1:])
def test_scenario_passes_on_the_reference_guest(
    base_guest: BaseGuest, profile_name: str, vmtests_report_dir: Path
) -> None:
    report_dir = vmtests_report_dir / profile_name
    scenario = run_scenario(base_guest.machine, profile_name, report_dir)
    assert_scenario_passed(scenario, base_guest.machine, report_dir)
