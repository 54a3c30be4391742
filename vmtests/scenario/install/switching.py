"""How a machine is put on a profile's serving configuration: one protocol for every caller.

The scenario switches once, from the machine's base configuration to its profile; the
certification switches between two profiles (its A/B) and back. Both know only ``Switcher``,
which two switches implement: ``vmtests.scenario.install.reference_switch.ReferenceSwitch`` (the
reference guest, which installs the units the Nix core or the NixOS evaluation describes) and
``CommandSwitch`` (a NixOS VM or a real host, where ``nixos-rebuild switch`` or
``switch-to-configuration`` does it). The ``switch_timeout`` setting is the one budget of a switch
command. Before anything changes, each can say whether its switch evaluates and would restart
the serving unit (``dry_run``), and record the generation the machine runs so that a failed run
can go back to it (``record_generation``, ``vmtests.scenario.install.generations``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from vmtests.contracts.serving import READY_TIMEOUT, SERVING_UNIT
from vmtests.contracts.settings import Settings
from vmtests.driver.errors import DriverError
from vmtests.driver.machine import Machine
from vmtests.profiles import Profile
from vmtests.scenario.install.generations import (
    DryRun,
    Generation,
    current_generation,
    nixos_dry_run,
)

SWITCH_TIMEOUT = Settings().switch_timeout
"""The switch_timeout setting's default (``vmtests.contracts.settings`` says why it is so)."""

PROFILE_FIELD = "{profile}"
"""Replaced by the profile's name in a switch command (``.../etc/nixos#{profile}``)."""


class Switcher(Protocol):
    """How a machine is put on a profile's serving configuration.

    ``restarts`` says whether ``switch`` restarts the serving unit itself, as
    switch-to-configuration does; when it does not, the caller restarts it (the certification
    does, with the stop checked). ``expected_system`` is the NixOS system (toplevel store path)
    a switch to the run's profile must activate, when it is known (a target pre-built into a
    VM's image): the scenario checks after the switch that it runs.
    """

    description: str
    restarts: bool
    expected_system: str | None

    def prepare_base(self, machine: Machine) -> None:
        """Bring ``machine`` to its base configuration (may do nothing on a real host)."""

    def switch(self, machine: Machine, profile: Profile) -> None:
        """Put ``machine`` on ``profile``'s configuration (the caller waits for /health)."""

    def dry_run(self, machine: Machine, profile: Profile) -> DryRun:
        """Whether the switch to ``profile`` evaluates and would restart the serving unit;
        changes nothing."""

    def record_generation(self, machine: Machine) -> Generation:
        """What ``machine`` runs now, and the command that goes back to it."""


def wait_healthy(machine: Machine, port: int, timeout: float = READY_TIMEOUT) -> None:
    """Wait until ``/health`` on ``port`` answers 200, whatever runs the server."""
    machine.wait_for_http_ok(port, "/health", timeout=timeout, unit=SERVING_UNIT)


def wait_ready(machine: Machine, port: int, timeout: float = READY_TIMEOUT) -> None:
    """Wait until the serving unit is active and ``/health`` answers 200, both within one
    ``timeout`` (the unit's activation counts against the server's start)."""
    deadline = time.monotonic() + timeout
    machine.wait_for_unit(SERVING_UNIT, timeout)
    wait_healthy(machine, port, max(1.0, deadline - time.monotonic()))


@dataclass
class CommandSwitch:
    """A switch by command on the machine: ``nixos-rebuild switch --flake /etc/nixos#{profile}``
    or ``<toplevel>/bin/switch-to-configuration switch``, ``{profile}`` replaced by the
    profile's name; the base is the machine as found, and the command restarts the unit;
    ``expected_system``: the toplevel it must activate (the one pre-built into a VM's image)."""

    command: str
    timeout: float = SWITCH_TIMEOUT
    description: str = ""
    restarts: bool = True
    expected_system: str | None = None

    def __post_init__(self) -> None:
        self.description = self.description or f"switch command: {self.command}"

    def prepare_base(self, machine: Machine) -> None:
        """Nothing to do: the machine's current configuration is the base."""

    def command_for(self, profile: Profile) -> str:
        """The command that switches to ``profile``."""
        return self.command.replace(PROFILE_FIELD, profile.name)

    def switch(self, machine: Machine, profile: Profile) -> None:
        """Run the switch command for ``profile`` (the caller then waits for the service)."""
        machine.succeed(self.command_for(profile), timeout=self.timeout)

    def dry_run(self, machine: Machine, profile: Profile) -> DryRun:
        """``nixos-rebuild dry-build``/``dry-activate`` (or switch-to-configuration's) of the
        same command; an unknown command cannot tell."""
        return nixos_dry_run(machine, self.command_for(profile), self.timeout)

    def record_generation(self, machine: Machine) -> Generation:
        """The NixOS generation the machine runs."""
        return current_generation(machine)


class NoSwitch:
    """No way to switch was given (a host certified without --ab): switching is an error."""

    description = "no switch command (the configuration is never changed)"
    restarts = True
    expected_system: str | None = None

    def prepare_base(self, machine: Machine) -> None:
        """Nothing to do: the machine's current configuration is the one used."""

    def switch(self, machine: Machine, profile: Profile) -> None:
        """Refuse: nothing tells us how to switch this machine."""
        raise RuntimeError(
            f"cannot switch {machine.name} to {profile.name}: no --switch-command was given"
        )

    def dry_run(self, machine: Machine, profile: Profile) -> DryRun:
        """Nothing would change: there is no switch."""
        return DryRun(True, False, "no switch command: the configuration is never changed")

    def record_generation(self, machine: Machine) -> Generation:
        """Nothing to go back to: the configuration is never changed."""
        raise DriverError(f"no switch command: nothing is recorded on {machine.name}")
