"""The persistence scenario of the first selftest profile (cfx-llm2), then the pre-merge negative
controls on the same guest (``controls_support.PRE_MERGE``; the rest, and the container path, are
in ``test_controls_nightly_vm.py``): the correct configuration raises no alarm, each real
persistence failure is caught, each with its own finding.

The scenario starts on a guest restored with the base serving (``base_deployed``; its switch and
reboot are real) and leaves it on the target, serving, where the controls start: each is reset
to the target first (``reset_to_target``), as ``vmtests selftest`` does with one lane. A guest
restored for each control would translate again every program the control runs, which costs a
short control more than its reset (``docs/ci-time.md``); ``test_prepared_vm.py`` runs a control
that way, as ``vmtests selftest`` does with several lanes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from controls_support import PRE_MERGE, assert_detected, assert_own_messages, run_controls
from vm_support import assert_scenario_passed, base_guest, run_scenario

from vmtests.cli import SELFTEST_PROFILES
from vmtests.driver.qemu import QemuMachine
from vmtests.scenario.controls.control import Control
from vmtests.scenario.controls.run import ControlsRun
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.runner.scenario import Scenario
from vmtests.scenario.runner.versions import upstream_version

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(620)]

PROFILE = SELFTEST_PROFILES[0]
"""The profile of the scenario, and whose target the controls start from (``vmtests
selftest``'s first)."""


class ScenarioGuest(NamedTuple):
    """The guest after its scenario, the scenario, and where its report went."""

    machine: QemuMachine
    scenario: Scenario
    report_dir: Path


@pytest.fixture(scope="module")
def scenario_guest(
    tmp_path_factory: pytest.TempPathFactory, vmtests_report_dir: Path
) -> Iterator[ScenarioGuest]:
    """A guest restored with the base serving that has run ``PROFILE``'s scenario (report in
    ``<PROFILE>``)."""
    report_dir = vmtests_report_dir / PROFILE
    with base_guest(tmp_path_factory.mktemp("scenario"), PROFILE) as machine:
        yield ScenarioGuest(machine, run_scenario(machine, PROFILE, report_dir), report_dir)


@pytest.fixture(scope="module")
def control_run(scenario_guest: ScenarioGuest, vmtests_report_dir: Path) -> ControlsRun:
    """On the scenario's guest: the correct configuration and the pre-merge controls, each reset
    to ``PROFILE``'s target first (report: ``controls``)."""
    switch = scenario_guest.scenario.switcher
    assert isinstance(switch, ReferenceSwitch)
    return run_controls(
        scenario_guest.machine, switch, PRE_MERGE, vmtests_report_dir / "controls", container=False
    )


def test_scenario_passes_on_the_reference_guest(scenario_guest: ScenarioGuest) -> None:
    guest = scenario_guest
    assert_scenario_passed(guest.scenario, guest.machine, guest.report_dir)


NEAREST_DEBIAN = {"systemd": (257,), "Docker": (26,)}
"""The least a reference guest may run (issue 26): Debian trixie's, the nearest Debian has to
NixOS 26.11's systemd 260 and Docker 29 (docs/instrumentation.md, "Debian trixie, not
bookworm"). An older guest would let a run here pass on behaviour NixOS no longer has."""


def test_the_reports_version_table_shows_a_guest_near_nixos(scenario_guest: ScenarioGuest) -> None:
    report = json.loads((scenario_guest.report_dir / "report.json").read_text())
    rows = {row["component"]: row for row in report["version_table"]["rows"]}
    for component, least in NEAREST_DEBIAN.items():
        found = upstream_version(rows[component]["run"])
        assert found is not None, rows[component]
        assert tuple(int(part) for part in found.split(".")[: len(least)]) >= least, rows[component]


def test_correct_configuration_raises_no_alarm(control_run: ControlsRun) -> None:
    assert control_run.false_alarms == [], "\n".join(map(str, control_run.false_alarms))
    # The explicit start left systemd's count of automatic restarts at 0.
    assert control_run.correct is not None
    assert control_run.correct.snapshot is not None
    assert control_run.correct.snapshot.unit.n_restarts == 0


@pytest.mark.parametrize("control", PRE_MERGE, ids=[control.name for control in PRE_MERGE])
def test_negative_control_is_detected(control: Control, control_run: ControlsRun) -> None:
    assert_detected(control, control_run)


def test_each_control_has_its_own_message(control_run: ControlsRun) -> None:
    assert_own_messages(PRE_MERGE, control_run)
