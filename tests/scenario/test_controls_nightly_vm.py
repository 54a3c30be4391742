"""The negative controls that pre-merge CI leaves out (``controls_support.NIGHTLY``; the
nightly tier, ``--nightly``), then the container path, on one guest restored with cfx-llm2's
target serving (``target_serving``): the correct configuration raises no alarm, each control is
caught with its own finding; a leftover container is stopped gracefully by the module's
pre-start and never killed, and oci-containers' own ``docker rm -f`` pre-start is caught by the
same check (exit code 137).

Each control is reset to the target first (``reset_to_target``), as in
``test_controls_vm.py``, which runs the other controls after the scenario.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from controls_support import NIGHTLY, assert_detected, assert_own_messages, run_controls

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.contracts.serving import SERVING_UNIT
from vmtests.profiles import load_profile
from vmtests.scenario.collection.snapshot import CONTAINER_LOG
from vmtests.scenario.controls.catalogue import CONTROLS, RM_F
from vmtests.scenario.controls.container_stop import SIGTERM
from vmtests.scenario.controls.control import Control
from vmtests.scenario.controls.run import ControlsRun
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.judgement.server_config import ENGINE_LINE
from vmtests.scenario.prepared import prepared_reference_guest, target_serving

pytestmark = [
    pytest.mark.vm, pytest.mark.nix, pytest.mark.nightly, pytest.mark.guest_seconds(500),
]  # fmt: skip

PROFILE = "cfx-llm2"


@pytest.fixture(scope="module")
def control_run(tmp_path_factory: pytest.TempPathFactory, vmtests_report_dir: Path) -> ControlsRun:
    """The correct configuration, the nightly controls and the container path on a guest
    restored with ``PROFILE``'s target serving (report: ``controls-nightly``)."""
    switch = ReferenceSwitch(load_profile(PROFILE))
    state_dir = tmp_path_factory.mktemp("controls-nightly")
    with prepared_reference_guest(state_dir, target_serving(switch), "controls") as prepared:
        return run_controls(
            prepared.machine, switch, NIGHTLY, vmtests_report_dir / "controls-nightly",
            container=True,
        )  # fmt: skip


def test_correct_configuration_raises_no_alarm(control_run: ControlsRun) -> None:
    assert control_run.false_alarms == [], "\n".join(map(str, control_run.false_alarms))


@pytest.mark.parametrize("control", NIGHTLY, ids=[control.name for control in NIGHTLY])
def test_negative_control_is_detected(control: Control, control_run: ControlsRun) -> None:
    assert_detected(control, control_run)


def test_each_control_has_its_own_message(control_run: ControlsRun) -> None:
    assert_own_messages(NIGHTLY, control_run)


def test_leftover_container_is_stopped_gracefully(control_run: ControlsRun) -> None:
    assert control_run.container is not None
    stops = control_run.container.graceful
    assert [stop.result.check for stop in stops] == [Check.GRACEFUL_STOP] * 2
    assert all(stop.result.ok for stop in stops), "\n".join(str(stop.result) for stop in stops)
    leftover = stops[0].events
    assert leftover.exit_codes[-1] == 0, leftover.raw
    assert SIGTERM in leftover.signals, leftover.raw


def test_oci_containers_rm_f_pre_start_is_caught(control_run: ControlsRun) -> None:
    assert control_run.container is not None
    outcome = control_run.container.rm_f
    assert outcome.detected, "\n".join(map(str, outcome.failures)) or outcome.message
    # Only the leftover was killed: the unit's own stop stays graceful.
    assert [(f.finding, f.subject) for f in outcome.failures] == [
        (RM_F.finds, "leftover container")
    ]


def test_a_flooded_journal_fails_only_the_evidence(control_run: ControlsRun) -> None:
    """journald dropped the start's lines and said so: that alone fails; the banners and the
    engine's config line, lost from the unit's journal, were found in the container's own log."""
    suppressed = Finding(Check.SNAPSHOT_EVIDENCE, Reason.JOURNAL_SUPPRESSED)
    (control,) = [c for c in CONTROLS if c.finds == suppressed]
    outcome = control_run.outcomes[control.name]
    assert outcome.findings == control.declared, "\n".join(map(str, outcome.failures))
    assert f"from {SERVING_UNIT}" in outcome.message
    snapshot = outcome.snapshot
    assert snapshot is not None
    assert snapshot.suppressed()[0].dropped > 0
    engine = [line for line in snapshot.current_lines() if ENGINE_LINE in line.message]
    assert engine
    assert {line.source for line in engine} == {CONTAINER_LOG}


def test_a_service_that_restarted_on_its_own_is_caught_with_its_count(
    control_run: ControlsRun,
) -> None:
    """Only the restart fails: the restarted service answers and holds every setting, and the
    message gives the count and the last exit status."""
    restarted = Finding(Check.SERVICE_RESTARTS, Reason.UNIT_RESTARTED)
    (control,) = [c for c in CONTROLS if c.finds == restarted]
    outcome = control_run.outcomes[control.name]
    assert outcome.findings == {restarted}, "\n".join(map(str, outcome.failures))
    assert outcome.snapshot is not None
    assert outcome.snapshot.health.status == 200
    assert outcome.snapshot.unit.n_restarts == 1
    assert "restarted on its own 1 time(s)" in outcome.message
    assert "code=exited, status=1/FAILURE" in outcome.message
