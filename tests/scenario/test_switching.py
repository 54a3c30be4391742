"""The one switching protocol: a command switch for any profile, within the one switch budget,
and the refusal to switch where no way to switch was given."""

from __future__ import annotations

from typing import cast

import pytest

from vmtests.driver.machine import Machine
from vmtests.profiles import load_profile
from vmtests.scenario.install.switching import SWITCH_TIMEOUT, CommandSwitch, NoSwitch, Switcher


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
