"""Negative controls on the reference guest, second half: each real persistence failure of this
half is caught, each with its own message. Then, on the same guest as ``vmtests selftest`` runs
them, the container path: a leftover container is stopped gracefully by the module's pre-start
and never killed; oci-containers' own ``docker rm -f`` pre-start is caught by the same check
(exit code 137). The first half runs on a guest of its own (``test_controls_vm.py``)."""

from __future__ import annotations

import pytest
from controls_support import (
    SECOND_HALF,
    ControlRun,
    assert_detected,
    assert_own_messages,
    control_run_fixture,
)

from vmtests.scenario.container_stop import CHECK
from vmtests.scenario.controls import Control

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(421)]

# One guest: the second half's controls, then the container controls.
control_run = control_run_fixture(2, SECOND_HALF, correct_configuration=False, container=True)


@pytest.mark.parametrize("control", SECOND_HALF, ids=[control.name for control in SECOND_HALF])
def test_negative_control_is_detected(control: Control, control_run: ControlRun) -> None:
    assert_detected(control, control_run)


def test_each_control_has_its_own_message(control_run: ControlRun) -> None:
    assert set(control_run.outcomes) == {control.name for control in SECOND_HALF}
    assert_own_messages(control_run)


def test_leftover_container_is_stopped_gracefully(control_run: ControlRun) -> None:
    assert control_run.container is not None
    results = control_run.container.graceful
    assert [r.check for r in results] == [CHECK, CHECK]
    assert all(r.ok for r in results), "\n".join(map(str, results))
    assert "exit code 0" in results[0].message
    assert "15" in results[0].message  # SIGTERM


def test_oci_containers_rm_f_pre_start_is_caught(control_run: ControlRun) -> None:
    assert control_run.container is not None
    outcome = control_run.container.rm_f
    assert outcome.detected, "\n".join(map(str, outcome.failures)) or outcome.message
    assert "was killed: exit code 137" in outcome.message
    # Only the leftover was killed: the unit's own stop stays graceful.
    assert len(outcome.failures) == 1, "\n".join(map(str, outcome.failures))
