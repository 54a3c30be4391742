"""Every negative control on one prepared guest, in the order ``vmtests selftest`` and CI run
them: the correct configuration's check, each of ``CONTROLS``, then the container controls.

``run_all_controls`` fills a ``ControlsRun`` as it goes, so that a caller that writes the report
in a ``finally`` has everything that ran before a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vmtests.driver.machine import Machine
from vmtests.scenario.controls.catalogue import CONTROLS
from vmtests.scenario.controls.container_stop import ContainerControls, run_container_controls
from vmtests.scenario.controls.control import ControlOutcome
from vmtests.scenario.controls.reset import check_correct_configuration, run_control
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.judgement.results import CheckResult


@dataclass
class ControlsRun:
    """What one guest showed: the correct configuration (``None`` until it ran), each control's
    outcome (by name, in the order run) and the container path (``None`` until it ran)."""

    correct: ControlOutcome | None = None
    outcomes: dict[str, ControlOutcome] = field(default_factory=dict)
    container: ContainerControls | None = None

    @property
    def false_alarms(self) -> list[CheckResult]:
        """What failed on the correct configuration: every failure there is a false alarm."""
        return self.correct.failures if self.correct else []

    @property
    def report_outcomes(self) -> list[ControlOutcome]:
        """The outcomes for the controls report: every control, then the ``rm -f`` control."""
        return [*self.outcomes.values(), *([self.container.rm_f] if self.container else [])]

    @property
    def report_false_alarms(self) -> list[CheckResult]:
        """The false alarms for the controls report, the container path's included."""
        return [*self.false_alarms, *(self.container.false_alarms if self.container else [])]


def run_all_controls(machine: Machine, switch: ReferenceSwitch, run: ControlsRun) -> ControlsRun:
    """Run every control on ``machine`` (prepared by ``switch``) into ``run``; return it."""
    run.correct = check_correct_configuration(machine, switch)
    for control in CONTROLS:
        run.outcomes[control.name] = run_control(machine, switch, control)
    run.container = run_container_controls(machine, switch)
    return run
