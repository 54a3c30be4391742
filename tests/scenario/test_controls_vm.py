"""Negative controls on the reference guest: each real persistence failure is caught, each with
its own message, and the correct configuration raises no alarm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vm_support import reference_machine

from vmtests.profiles import load_profile
from vmtests.report import write_controls_report
from vmtests.scenario.controls import (
    CONTROLS,
    Control,
    ControlOutcome,
    check_correct_configuration,
    run_control,
)
from vmtests.scenario.reference_switch import ReferenceSwitch
from vmtests.scenario.results import CheckResult

pytestmark = [pytest.mark.vm, pytest.mark.nix]


@pytest.fixture(scope="module")
def control_run(
    tmp_path_factory: pytest.TempPathFactory, vmtests_report_dir: Path
) -> Iterator[tuple[list[CheckResult], dict[str, ControlOutcome]]]:
    """One guest: the correct configuration's false alarms, then every control's outcome."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    outcomes: dict[str, ControlOutcome] = {}
    false_alarms: list[CheckResult] = []
    with reference_machine(tmp_path_factory.mktemp("controls"), name="controls") as machine:
        try:
            machine.start()
            switch.prepare_base(machine)
            false_alarms = check_correct_configuration(machine, switch)
            for control in CONTROLS:
                outcomes[control.name] = run_control(machine, switch, control)
        finally:
            write_controls_report(
                list(outcomes.values()), false_alarms, vmtests_report_dir / "controls"
            )
        yield false_alarms, outcomes


def test_correct_configuration_raises_no_alarm(
    control_run: tuple[list[CheckResult], dict[str, ControlOutcome]],
) -> None:
    false_alarms, _ = control_run
    assert false_alarms == [], "\n".join(str(alarm) for alarm in false_alarms)


@pytest.mark.parametrize("control", CONTROLS, ids=[control.name for control in CONTROLS])
def test_negative_control_is_detected(
    control: Control, control_run: tuple[list[CheckResult], dict[str, ControlOutcome]]
) -> None:
    outcome = control_run[1][control.name]
    seen = "\n".join(str(failure) for failure in outcome.failures) or "(no failure at all)"
    assert outcome.detected, (
        f"{control.name}: no {control.check} failure matched /{control.message.pattern}/; "
        f"failures seen:\n{seen}"
    )


def test_each_control_has_its_own_message(
    control_run: tuple[list[CheckResult], dict[str, ControlOutcome]],
) -> None:
    outcomes = control_run[1]
    assert len(outcomes) == len(CONTROLS)
    negative = [control for control in CONTROLS if not control.false_alarm]
    messages = [outcomes[control.name].message for control in negative]
    assert len(set(messages)) == len(messages)
    for control in negative:  # no other control's pattern explains this control's message
        message = outcomes[control.name].message
        others = [c.name for c in negative if c is not control and c.message.search(message)]
        assert others == [], f"{control.name}'s message also matches {others}: {message}"
