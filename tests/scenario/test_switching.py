"""The one switching protocol: a command switch for any profile, within the one switch budget,
and the refusal to switch where no way to switch was given."""

from __future__ import annotations

import time
from typing import cast

import pytest

from vmtests.driver.errors import UnitWillNotStart
from vmtests.driver.machine import Machine
from vmtests.profiles import load_profile
from vmtests.scenario.install.switching import (
    SWITCH_TIMEOUT,
    CommandSwitch,
    NoSwitch,
    Switcher,
    wait_ready,
)


class _Recorder:
    """Stands in for a machine: records what ``succeed`` was asked to run, and for how long."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def succeed(self, command: str, *args: object, timeout: float) -> str:
        self.calls.append((command, timeout))
        return ""


def test_a_command_switch_names_the_profile_and_has_the_one_budget() -> None:
    recorder = _Recorder()
    switch: Switcher = CommandSwitch("nixos-rebuild switch --flake /etc/nixos#{profile} ${X:-y}")
    switch.switch(cast(Machine, recorder), load_profile("resident"))
    # ``${X:-y}`` is left to the shell: only the profile field is replaced.
    assert recorder.calls == [
        ("nixos-rebuild switch --flake /etc/nixos#resident ${X:-y}", SWITCH_TIMEOUT)
    ]
    assert switch.restarts
    assert (
        switch.description
        == "switch command: nixos-rebuild switch --flake /etc/nixos#{profile} ${X:-y}"
    )


def test_a_fixed_command_is_run_as_given() -> None:
    recorder = _Recorder()
    CommandSwitch("switch-to-configuration switch", timeout=5).switch(
        cast(Machine, recorder), load_profile("cfx-llm2")
    )
    assert recorder.calls == [("switch-to-configuration switch", 5)]


def test_no_switch_refuses_to_switch() -> None:
    recorder = _Recorder()
    with pytest.raises(
        RuntimeError, match="cannot switch recorder to resident: no --switch-command"
    ):
        NoSwitch().switch(cast(Machine, recorder), load_profile("resident"))
    assert recorder.calls == []


class _SlowUnit:
    """Stands in for a machine whose unit takes ``activation`` seconds (a fake clock) to become
    active; records the budget each wait got."""

    name = "slow-unit"

    def __init__(self, clock: list[float], activation: float) -> None:
        self.clock, self.activation = clock, activation
        self.budgets: dict[str, float] = {}

    def wait_for_unit(self, unit: str, timeout: float) -> None:
        self.budgets["unit"] = timeout
        self.clock[0] += self.activation

    def wait_for_http_ok(self, port: int, path: str, timeout: float, unit: str) -> None:
        self.budgets["health"] = timeout


def test_the_unit_and_health_waits_share_one_ready_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A P150 unit that activates for 3000 s of a 3600 s budget leaves /health 600 s, not a
    # fresh 3600 s: a server that never answers is reported after ready_timeout, not twice it.
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    machine = _SlowUnit(clock, activation=3000.0)
    wait_ready(cast(Machine, machine), 8000, timeout=3600.0)
    assert machine.budgets == {"unit": 3600.0, "health": 600.0}


class _UnitNeverStarts:
    """Stands in for a machine whose serving unit will never start (``wait_for_unit`` stops at
    once); records whether /health was polled after it."""

    name = "never-starts"

    def __init__(self) -> None:
        self.health_polled = False

    def wait_for_unit(self, unit: str, timeout: float) -> None:
        raise UnitWillNotStart(unit, "inactive", "is 'inactive' with no job queued", "status")

    def wait_for_http_ok(self, port: int, path: str, timeout: float, unit: str) -> None:
        self.health_polled = True


def test_a_unit_that_will_not_start_ends_the_ready_wait_unchanged() -> None:
    # The readiness wait neither swallows the early stop nor spends the budget on /health.
    machine = _UnitNeverStarts()
    with pytest.raises(UnitWillNotStart) as caught:
        wait_ready(cast(Machine, machine), 8000, timeout=3600.0)
    assert "is 'inactive' with no job queued" in str(caught.value)
    assert not machine.health_polled
