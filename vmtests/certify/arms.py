"""Switching the machine to one serving configuration, with the checks that prove it happened.

A configuration is a YAML profile (``vmtests/profiles``) and what the Nix core computes for its
serving profile (``hosts/profiles/*.nix``), including the expected config digest. How to install
it depends on the target:

- ``ReferenceInstaller``: the reference guest's install step from the persistence scenario
  (``vmtests.scenario.reference_switch.install_units``: the NixOS evaluation's units, or units
  rendered from the core's output; daemon-reload, enable), without its restart: the caller
  restarts through the unit and checks the stop;
- ``CommandInstaller``: a command on the machine, e.g. ``nixos-rebuild switch --flake
  /etc/nixos#{profile}``; switch-to-configuration restarts the unit itself, so the kill check
  reads the unit's journal since the switch began.

After every switch: the unit is active, ``/health`` answers, the profile's flags, environment
and banners hold in the current start (the scenario's ``check_service``/``check_profile``), and
the module banner's digest equals the core's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vmtests.certify import hostops
from vmtests.driver.machine import Machine
from vmtests.guest.stub_layer import install_stub_device_layer
from vmtests.nixcore import CoreOutput, evaluate_core
from vmtests.profiles import Profile
from vmtests.scenario.checks import check_profile, check_service
from vmtests.scenario.collect import take_snapshot
from vmtests.scenario.reference_switch import install_units, reference_config, units_source
from vmtests.scenario.snapshot import Snapshot
from vmtests.scenario.switching import wait_ready

SWITCH_COMMAND_TIMEOUT = 900.0


@dataclass(frozen=True)
class Configuration:
    """A profile and the core's output for its serving profile."""

    profile: Profile
    core: CoreOutput

    @property
    def name(self) -> str:
        """The profile name."""
        return self.profile.name

    @property
    def digest(self) -> str:
        """The config digest the module banner must carry."""
        return self.core.digest

    @classmethod
    def of(cls, profile: Profile) -> Configuration:
        """Evaluate the Nix core for ``profile`` (on this host, with nix-instantiate)."""
        return cls(profile, evaluate_core(profile_file=Path(profile.serving_profile)))


class Installer(Protocol):
    """Puts a configuration on the machine; returns True when the caller must restart."""

    description: str

    def install(self, machine: Machine, config: Configuration) -> bool:
        """Install ``config``; True: the unit still runs the old process (restart it)."""


class ReferenceInstaller:
    """The reference guest: the scenario's install step, the restart left to the caller."""

    def __init__(self) -> None:
        self.source, why = units_source()
        what = "the NixOS evaluation's units" if self.source == "nixos" else "rendered units"
        self.description = f"reference install step ({what}: {why})"

    def install(self, machine: Machine, config: Configuration) -> bool:
        """Write the units for ``config`` and reload systemd; no restart."""
        serving = reference_config(
            machine, config.profile.serving_profile, config.core, self.source
        )
        install_units(machine, serving, restart=False)
        return True


@dataclass
class CommandInstaller:
    """A switch command; ``{profile}`` is replaced by the profile name."""

    template: str
    description: str = ""

    def __post_init__(self) -> None:
        self.description = self.description or f"switch command: {self.template}"

    def install(self, machine: Machine, config: Configuration) -> bool:
        """Run the switch command (it restarts the unit itself)."""
        machine.succeed(self.template.format(profile=config.name), timeout=SWITCH_COMMAND_TIMEOUT)
        return False


class NoSwitch:
    """No way to switch was given (a host certified without --ab): switching is an error."""

    description = "no switch command (the configuration is never changed)"

    def install(self, machine: Machine, config: Configuration) -> bool:
        """Refuse: nothing tells us how to switch this machine."""
        raise RuntimeError(
            f"cannot switch {machine.name} to {config.name}: no --switch-command was given"
        )


@dataclass
class SwitchRecord:
    """One switch (or restart) to a configuration and everything checked after it."""

    configuration: str
    reason: str
    stop: dict[str, Any] | None = None
    kills: list[str] = field(default_factory=list)
    digest: str = ""
    expected_digest: str = ""
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when nothing was killed and every check after the switch held."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "configuration": self.configuration,
            "reason": self.reason,
            "stop": self.stop,
            "kills": self.kills,
            "digest": self.digest,
            "expected_digest": self.expected_digest,
            "failures": self.failures,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
        }


def verify(config: Configuration, snapshot: Snapshot) -> list[str]:
    """What does not hold after a switch to ``config``: service, profile, digest."""
    results = check_service(snapshot) + check_profile(config.profile, snapshot)
    failures = [str(result) for result in results if result.failed]
    digest = hostops.config_digest(snapshot)
    if digest != config.digest:
        failures.append(
            f"module banner digest {digest or '(none)'} is not {config.digest} of {config.name}"
        )
    return failures


def switch_to(
    machine: Machine,
    installer: Installer,
    config: Configuration,
    *,
    port: int,
    reason: str,
    container: str | None = None,
) -> SwitchRecord:
    """Install ``config``, restart through the unit (checked), wait, and verify it is live."""
    began = time.monotonic()
    record = SwitchRecord(config.name, reason, expected_digest=config.digest)
    since = hostops.machine_time(machine)
    if installer.install(machine, config):
        outcome = hostops.stop_checked(machine)
        record.stop = outcome.to_dict()
        if not outcome.ok:
            record.failures.append(f"stop before {config.name}: {outcome.message}")
        hostops.start(machine, port)
    else:
        wait_ready(machine, port, hostops.START_TIMEOUT)
    record.kills = hostops.kills_since(machine, since)
    if record.stop is None or record.stop["ok"]:  # a failed stop check already says it
        record.failures += [f"the unit's main process was killed: {k}" for k in record.kills]
    # verify() reads the service, the profile and the banner digest, not the card.
    snapshot = take_snapshot(
        machine, f"switch to {config.name}", port=port, container=container, card=False
    )
    record.digest = hostops.config_digest(snapshot)
    record.failures += verify(config, snapshot)
    record.seconds = time.monotonic() - began
    return record


def deploy_reference(machine: Machine, config: Configuration, port: int) -> None:
    """Give a fresh reference guest the stub device layer and ``config``, serving.

    This is the reference guest's stand-in for a host deployed with the NixOS module: the
    scenario's install step for the profile, after which the certification starts as on a host.
    """
    install_stub_device_layer(machine)
    source, _ = units_source()
    install_units(
        machine, reference_config(machine, config.profile.serving_profile, config.core, source)
    )
    wait_ready(machine, port)
