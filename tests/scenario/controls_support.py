"""The negative controls split over two reference guests, so that the two halves run in parallel.

Each half boots its own guest, prepares the same base, and runs its controls in the order of
``vmtests.scenario.controls.CONTROLS`` (``vmtests selftest`` runs them all on one guest). The
first half also checks the correct configuration; the second ends with the container path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
from vm_support import reference_machine

from vmtests.profiles import load_profile
from vmtests.report import write_controls_report
from vmtests.scenario.container_stop import ContainerControls, run_container_controls
from vmtests.scenario.controls import (
    CONTROLS,
    Control,
    ControlOutcome,
    check_correct_configuration,
    run_control,
)
from vmtests.scenario.reference_switch import ReferenceSwitch
from vmtests.scenario.results import CheckResult

FIRST_HALF: tuple[Control, ...] = tuple(CONTROLS[:8])
"""The correct configuration, then these (the reboot control among them)."""
SECOND_HALF: tuple[Control, ...] = tuple(CONTROLS[8:])
"""These, then the container controls."""


class ControlRun(NamedTuple):
    """What one guest showed: false alarms, its controls' outcomes, the container path."""

    false_alarms: list[CheckResult]
    outcomes: dict[str, ControlOutcome]
    container: ContainerControls | None


@contextmanager
def run_controls(
    directory: Path,
    report_dir: Path,
    controls: tuple[Control, ...],
    *,
    correct_configuration: bool,
    container: bool,
) -> Iterator[ControlRun]:
    """Boot one guest, prepare the base and run ``controls`` (after the correct configuration's
    check and before the container controls when asked); write the report to ``report_dir``
    even when a control fails to run, and keep the guest until the caller is done."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    outcomes: dict[str, ControlOutcome] = {}
    false_alarms: list[CheckResult] = []
    container_run: ContainerControls | None = None
    with reference_machine(directory, name=report_dir.name) as machine:
        try:
            machine.start()
            switch.prepare_base(machine)
            if correct_configuration:
                false_alarms = check_correct_configuration(machine, switch)
            for control in controls:
                outcomes[control.name] = run_control(machine, switch, control)
            if container:
                container_run = run_container_controls(machine, switch)
        finally:
            write_controls_report(
                [*outcomes.values(), *([container_run.rm_f] if container_run else [])],
                [*false_alarms, *(container_run.false_alarms if container_run else [])],
                report_dir,
            )
        yield ControlRun(false_alarms, outcomes, container_run)


def control_run_fixture(
    number: int, controls: tuple[Control, ...], *, correct_configuration: bool, container: bool
) -> Callable[..., Iterator[ControlRun]]:
    """A test module's ``control_run`` fixture: one guest running ``controls`` (see
    ``run_controls``), its report in ``controls-<number>``."""

    @pytest.fixture(scope="module")
    def control_run(
        tmp_path_factory: pytest.TempPathFactory, vmtests_report_dir: Path
    ) -> Iterator[ControlRun]:
        """The guest's false alarms, control outcomes and container path (``ControlRun``)."""
        with run_controls(
            tmp_path_factory.mktemp("controls"),
            vmtests_report_dir / f"controls-{number}",
            controls,
            correct_configuration=correct_configuration,
            container=container,
        ) as run:
            yield run

    return control_run


def assert_detected(control: Control, run: ControlRun) -> None:
    """The control was caught by its own check, with a message its own pattern matches."""
    outcome = run.outcomes[control.name]
    seen = "\n".join(str(failure) for failure in outcome.failures) or "(no failure at all)"
    assert outcome.detected, (
        f"{control.name}: no {control.check} failure matched /{control.message.pattern}/; "
        f"failures seen:\n{seen}"
    )


def assert_own_messages(run: ControlRun) -> None:
    """No other control's pattern (of either half) explains a control's message, so no two
    controls can share one."""
    negative = [control for control in CONTROLS if not control.false_alarm]
    for control in negative:
        if control.name not in run.outcomes:
            continue
        message = run.outcomes[control.name].message
        others = [c.name for c in negative if c is not control and c.message.search(message)]
        assert others == [], f"{control.name}'s message also matches {others}: {message}"
