"""Switching the machine to one serving configuration, with the checks that prove it happened.

A configuration is a YAML profile (``vmtests/profiles``) and what the Nix core computes for its
serving profile (``hosts/profiles/*.nix``), including the expected config digest. The switch is
the scenario's ``Switcher`` (``vmtests.scenario.install.switching``):

- on the reference guest, its install step (``ReferenceSwitch`` with ``restart=False``: the
  NixOS evaluation's units, or units rendered from the core's output; daemon-reload, enable),
  after which the caller restarts through the unit and checks the stop;
- elsewhere a ``CommandSwitch``, e.g. ``nixos-rebuild switch --flake /etc/nixos#{profile}``;
  switch-to-configuration restarts the unit itself, so the kill check reads the unit's journal
  since the switch began.

After every switch: the unit is active, ``/health`` answers, the profile's flags, environment
and banners hold in the current start (the scenario's ``check_service``/``check_profile``), and
the module banner's digest equals the core's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmtests.certify import hostops
from vmtests.contracts.settings import Settings
from vmtests.driver.machine import Machine
from vmtests.nixcore import CoreOutput, evaluate_core
from vmtests.profiles import Profile
from vmtests.scenario.collection.collect import take_snapshot
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.install.switching import Switcher, wait_ready
from vmtests.scenario.judgement.checks import check_profile, check_service


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
    switcher: Switcher,
    config: Configuration,
    *,
    settings: Settings,
    reason: str,
) -> SwitchRecord:
    """Switch to ``config`` (restarting through the unit, checked, when the switch does not
    restart it itself), wait, and verify it is live."""
    began = time.monotonic()
    record = SwitchRecord(config.name, reason, expected_digest=config.digest)
    since = hostops.machine_time(machine)
    switcher.switch(machine, config.profile)
    if not switcher.restarts:
        outcome = hostops.stop_checked(machine, settings)
        record.stop = outcome.to_dict()
        if not outcome.ok:
            record.failures.append(f"stop before {config.name}: {outcome.message}")
        hostops.start(machine, settings)
    else:
        wait_ready(machine, settings.serving_port, settings.ready_timeout)
    record.kills = hostops.kills_since(machine, since)
    if record.stop is None or record.stop["ok"]:  # a failed stop check already says it
        record.failures += [f"the unit's main process was killed: {k}" for k in record.kills]
    # verify() reads the service, the profile and the banner digest, not the card.
    snapshot = take_snapshot(
        machine,
        f"switch to {config.name}",
        port=settings.serving_port,
        container=settings.container,
        card=False,
        api_key_file=settings.api_key_file,
    )
    record.digest = hostops.config_digest(snapshot)
    record.failures += verify(config, snapshot)
    record.seconds = time.monotonic() - began
    return record


def reference_switch(profile: Profile) -> ReferenceSwitch:
    """The certification's switch on the reference guest: its base is ``profile`` itself (the
    guest stands in for a host deployed with the module), and it leaves restarts to the run,
    which checks each stop."""
    return ReferenceSwitch(profile, profile.serving_profile, restart=False)
