"""Negative controls on the reference guest, first half: the correct configuration raises no
alarm, and each real persistence failure of this half is caught, each with its own message.
The second half runs on a guest of its own (``test_controls_more_vm.py``)."""

from __future__ import annotations

import pytest
from controls_support import (
    FIRST_HALF,
    SECOND_HALF,
    ControlRun,
    assert_detected,
    assert_own_messages,
    control_run_fixture,
)

from vmtests.scenario.controls import CONTROLS, Control

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(508)]

# One guest: the correct configuration's false alarms, then the first half's controls.
control_run = control_run_fixture(1, FIRST_HALF, correct_configuration=True, container=False)


def test_the_two_halves_run_every_control_once() -> None:
    assert [*FIRST_HALF, *SECOND_HALF] == list(CONTROLS)
    assert FIRST_HALF
    assert SECOND_HALF


def test_correct_configuration_raises_no_alarm(control_run: ControlRun) -> None:
    assert control_run.false_alarms == [], "\n".join(map(str, control_run.false_alarms))


@pytest.mark.parametrize("control", FIRST_HALF, ids=[control.name for control in FIRST_HALF])
def test_negative_control_is_detected(control: Control, control_run: ControlRun) -> None:
    assert_detected(control, control_run)


def test_each_control_has_its_own_message(control_run: ControlRun) -> None:
    assert set(control_run.outcomes) == {control.name for control in FIRST_HALF}
    assert_own_messages(control_run)
