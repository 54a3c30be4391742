"""A service that restarts on its own while answering is caught at S1 with its restart count, on
a guest of its own restored in the state the control starts from (cheaper than the whole
controls module, ``test_controls_vm.py``, which runs it with the others)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.profiles import load_profile
from vmtests.scenario.controls.catalogue import CONTROLS, CORRECT_CONFIGURATION
from vmtests.scenario.controls.reset import run_control
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.prepared import control_guests

pytestmark = [pytest.mark.vm, pytest.mark.nix]

RESTARTED = Finding(Check.SERVICE_RESTARTS, Reason.UNIT_RESTARTED)


def test_a_service_that_restarted_on_its_own_is_caught_with_its_count(tmp_path: Path) -> None:
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    (control,) = [c for c in CONTROLS if c.finds == RESTARTED]
    with control_guests(tmp_path, switch)(control.starts_from) as guest:
        outcome = run_control(guest, switch, control, reset=False)
    seen = "\n".join(str(failure) for failure in outcome.failures) or "(no failure at all)"
    # Only the restart fails: the restarted service answers and holds every setting.
    assert outcome.findings == {RESTARTED}, seen
    assert outcome.snapshot is not None
    assert outcome.snapshot.health.status == 200
    assert outcome.snapshot.unit.n_restarts == 1
    assert "restarted on its own 1 time(s)" in outcome.message
    assert "code=exited, status=1/FAILURE" in outcome.message


def test_the_correct_configuration_raises_no_restart_alarm(tmp_path: Path) -> None:
    """The target as the reference switch installs and starts it: the explicit start left
    ``NRestarts`` at 0, and nothing fails."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    control = CORRECT_CONFIGURATION
    with control_guests(tmp_path, switch)(control.starts_from) as guest:
        outcome = run_control(guest, switch, control, reset=False)
    seen = "\n".join(str(failure) for failure in outcome.failures)
    assert outcome.detected, seen
    assert outcome.snapshot is not None
    assert outcome.snapshot.unit.n_restarts == 0
