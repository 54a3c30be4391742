"""How every control is run, without a VM: with fresh guests, each control (the correct
configuration and the container path included) gets a guest of its own in the state its
catalogue entry declares and nothing is reset; on one machine, each is reset first; either way
the outcomes are reported in the catalogue's order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import pytest

from vmtests.driver.machine import Machine
from vmtests.scenario.controls import run as controls_run
from vmtests.scenario.controls.catalogue import CONTROLS, CORRECT_CONFIGURATION
from vmtests.scenario.controls.container_stop import STARTS_FROM, ContainerControls
from vmtests.scenario.controls.control import Control, ControlOutcome, StartingPoint
from vmtests.scenario.controls.run import ControlsRun, control_jobs
from vmtests.scenario.install.reference_switch import ReferenceSwitch

SWITCH = cast(ReferenceSwitch, object())
"""Stands in for the switch: the stand-ins of the mechanisms below never read it."""


@dataclass(frozen=True)
class Guest:
    """Stands in for a guest: which one, and the state it was given."""

    number: int
    starts_from: StartingPoint


@dataclass
class Calls:
    """What the stand-ins were asked to do: (step, guest, reset) in the order asked."""

    seen: list[tuple[str, object, bool]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """``run_control`` and ``run_container_controls`` replaced by stand-ins that record."""
    recorded = Calls([])

    def run_control(
        machine: Machine, switch: ReferenceSwitch, control: Control, *, reset: bool = True
    ) -> ControlOutcome:
        recorded.seen.append((control.name, machine, reset))
        return ControlOutcome(control.name, control.mechanism, control.finds, True, "caught")

    def run_container_controls(
        machine: Machine, switch: ReferenceSwitch, *, reset: bool = True
    ) -> ContainerControls:
        recorded.seen.append(("container path", machine, reset))
        return ContainerControls([], ControlOutcome("rm -f", "", None, True, "caught"))

    monkeypatch.setattr(controls_run, "run_control", run_control)
    monkeypatch.setattr(controls_run, "run_container_controls", run_container_controls)
    return recorded


def test_each_control_starts_on_a_fresh_guest_in_the_state_it_declares(calls: Calls) -> None:
    given: list[Guest] = []

    @contextmanager
    def fresh(starts_from: StartingPoint) -> Iterator[Machine]:
        given.append(Guest(len(given), starts_from))
        yield cast(Machine, given[-1])

    run = ControlsRun()
    for job in reversed(control_jobs(SWITCH, run, fresh=fresh)):  # any order: lanes
        job()
    run.in_order()

    declared = [CORRECT_CONFIGURATION, *CONTROLS]
    given_to = {name: cast(Guest, guest).starts_from for name, guest, _ in calls.seen}
    assert given_to == {
        **{control.name: control.starts_from for control in declared},
        "container path": STARTS_FROM,
    }
    assert len({id(guest) for _, guest, _ in calls.seen}) == len(declared) + 1  # none shared
    assert not any(reset for _, _, reset in calls.seen)  # a restore stands in for the reset
    assert list(run.outcomes) == [control.name for control in CONTROLS]
    assert run.correct is not None
    assert run.container is not None


def test_on_one_machine_each_control_is_reset_first(calls: Calls) -> None:
    machine = cast(Machine, object())
    run = ControlsRun()
    for job in control_jobs(SWITCH, run, machine=machine):
        job()
    names = [CORRECT_CONFIGURATION.name, *(c.name for c in CONTROLS), "container path"]
    assert calls.seen == [(name, machine, True) for name in names]
    assert list(run.outcomes) == [control.name for control in CONTROLS]
