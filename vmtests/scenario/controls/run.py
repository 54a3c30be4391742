"""Every negative control, in the order ``vmtests selftest`` and CI run them: the correct
configuration's check, each of ``CONTROLS``, then the container controls.

Each starts from the state it declares (``Control.starts_from``): on a guest of its own,
restored from a snapshot of that state (``fresh``, ``vmtests.scenario.prepared``), or on one
guest reset to the target before each (``reset_to_target``). ``run_all_controls`` fills a
``ControlsRun`` as it goes, so that a caller that writes the report in a ``finally`` has
everything that ran before a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from vmtests.driver.machine import Machine
from vmtests.scenario.controls.catalogue import CONTROLS, CORRECT_CONFIGURATION
from vmtests.scenario.controls.container_stop import (
    STARTS_FROM,
    ContainerControls,
    run_container_controls,
)
from vmtests.scenario.controls.control import Control, ControlOutcome, StartingPoint
from vmtests.scenario.controls.reset import run_control
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

    def in_order(self) -> None:
        """Order the outcomes as ``CONTROLS`` lists them, whichever ran first."""
        self.outcomes = {c.name: self.outcomes[c.name] for c in CONTROLS if c.name in self.outcomes}

    @property
    def report_false_alarms(self) -> list[CheckResult]:
        """The false alarms for the controls report, the container path's included."""
        return [*self.false_alarms, *(self.container.false_alarms if self.container else [])]


FreshGuest = Callable[[StartingPoint], AbstractContextManager[Machine]]
"""A guest fresh for each call in the state a control starts from (restored from a snapshot of
it, ``vmtests.scenario.prepared.control_guests``), closed after."""
Result = TypeVar("Result")


def run_all_controls(
    machine: Machine,
    switch: ReferenceSwitch,
    run: ControlsRun,
    controls: Sequence[Control] = CONTROLS,
    *,
    container: bool = True,
) -> ControlsRun:
    """Run the correct configuration, ``controls`` (every control unless told) and, with
    ``container``, the container controls on ``machine`` (prepared by ``switch``) into ``run``,
    each reset to the target first; return it."""
    for job in control_jobs(switch, run, machine=machine, controls=controls, container=container):
        job()
    return run


def control_jobs(
    switch: ReferenceSwitch,
    run: ControlsRun,
    *,
    machine: Machine | None = None,
    fresh: FreshGuest | None = None,
    controls: Sequence[Control] = CONTROLS,
    container: bool = True,
) -> list[Callable[[], None]]:
    """The correct configuration's check, each of ``controls`` and (with ``container``) the
    container controls as jobs that fill ``run`` (for ``run_in_lanes``; several lanes only with
    ``fresh`` guests). With ``fresh``, each job runs on a guest of its own and a control's
    ``seconds`` include its guest's restore; else all run on ``machine``, each reset to the
    target first."""

    def on_a_guest(step: Callable[[Machine, bool], Result], starts_from: StartingPoint) -> Result:
        if fresh is None:
            assert machine is not None, "the controls need a machine or fresh guests"
            return step(machine, True)
        with fresh(starts_from) as guest:
            return step(guest, False)

    def timed(control: Control) -> ControlOutcome:
        start = time.monotonic()
        outcome = on_a_guest(
            lambda guest, reset: run_control(guest, switch, control, reset=reset),
            control.starts_from,
        )
        if fresh is not None:
            outcome.seconds = time.monotonic() - start
        return outcome

    def correct_configuration() -> None:
        run.correct = timed(CORRECT_CONFIGURATION)

    def control_job(control: Control) -> None:
        run.outcomes[control.name] = timed(control)

    def container_controls() -> None:
        run.container = on_a_guest(
            lambda guest, reset: run_container_controls(guest, switch, reset=reset), STARTS_FROM
        )

    return [
        correct_configuration,
        *(partial(control_job, control) for control in controls),
        *([container_controls] if container else []),
    ]
