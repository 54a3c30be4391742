"""What a negative control is: its declaration (the findings that must catch it, what it leaves
behind), its mechanism and its effect on a snapshot, and how its outcome is judged.

``Catalogue.control`` declares a control on its mechanism's function, so that a new control is
one entry (``vmtests.scenario.controls.catalogue``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from vmtests.contracts.findings import Finding
from vmtests.driver.machine import Machine
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.judgement.results import CheckResult, failures, findings

Apply = Callable[[Machine, ReferenceSwitch], None]
"""A control's mechanism: what it does to the reference guest."""
Effect = Callable[[Snapshot], None]
"""A control's effect: what its mechanism does to a snapshot (a copy), as the snapshot script
would record it."""
StartingPoint = Literal["clean", "installed", "running"]


@dataclass(frozen=True)
class Footprint:
    """What a control leaves on the guest beyond the target's own units, for the reset to take
    away: ``files`` (removed), ``masked_units`` (unmasked), ``transient_units`` (their runtime
    unit files removed), ``manager_variables`` (unset), ``stub_knobs`` (set back to none),
    ``containers`` (stopped gracefully, then removed) and ``pid_files`` (their processes
    killed, the files removed)."""

    files: frozenset[str] = frozenset()
    masked_units: frozenset[str] = frozenset()
    transient_units: frozenset[str] = frozenset()
    manager_variables: frozenset[str] = frozenset()
    stub_knobs: frozenset[str] = frozenset()
    containers: frozenset[str] = frozenset()
    pid_files: frozenset[str] = frozenset()

    def __or__(self, other: Footprint) -> Footprint:
        return Footprint(
            **{
                part.name: getattr(self, part.name) | getattr(other, part.name)
                for part in dataclasses.fields(self)
            }
        )


@dataclass(frozen=True, kw_only=True)
class Declaration:
    """What a control says about itself: its name, its mechanism in words, the finding that
    must catch it (None: a false-alarm control, which must raise nothing), what its mechanism
    breaks besides (``also``) and what it leaves behind."""

    name: str
    mechanism: str
    finds: Finding | None
    also: frozenset[Finding] = frozenset()
    footprint: Footprint = Footprint()

    @property
    def false_alarm(self) -> bool:
        """True for a control that must raise no failure at all."""
        return self.finds is None

    @property
    def declared(self) -> frozenset[Finding]:
        """Every finding the control must raise: ``finds`` and ``also``."""
        return self.also | ({self.finds} if self.finds else set())


@dataclass(frozen=True, kw_only=True)
class Control(Declaration):
    """One negative control run on a snapshot of the guest: how to apply it (``apply``) and
    what it does to a snapshot (``effect``).

    ``starts_from`` is the state the mechanism needs: ``running`` (it changes a running target:
    masks, disables), ``installed`` (the target's units, stopped) or ``clean`` (it installs and
    starts what it needs itself, and its first step reloads systemd: the reset does not). Each
    restart or daemon-reload the reset saves costs seconds to most of a minute under TCG.
    """

    apply: Apply
    effect: Effect
    reboot: bool = False
    settle: bool = True  # wait for the unit and /health after applying (False: unit stopped)
    starts_from: StartingPoint = "clean"


@dataclass
class ControlOutcome:
    """What happened when a control was applied: detected or not, the failures it raised (the
    message of the one that caught it first) and the snapshot they come from."""

    name: str
    mechanism: str
    finds: Finding | None
    detected: bool
    message: str
    failures: list[CheckResult] = field(default_factory=list)
    snapshot: Snapshot | None = None
    seconds: float = 0.0

    @property
    def findings(self) -> set[Finding]:
        """The distinct findings of the failures."""
        return findings(self.failures)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "name": self.name,
            "mechanism": self.mechanism,
            "finds": None if self.finds is None else str(self.finds),
            "check": None if self.finds is None else self.finds.check,
            "reason": None if self.finds is None else self.finds.reason,
            "detected": self.detected,
            "message": self.message,
            "findings": sorted(map(str, self.findings)),
            "failures": [failure.to_dict() for failure in self.failures],
            "snapshot": None if self.snapshot is None else self.snapshot.to_dict(),
            "seconds": round(self.seconds, 2),
        }


def judge(
    control: Declaration, results: list[CheckResult], snapshot: Snapshot | None = None
) -> ControlOutcome:
    """The outcome of ``control`` that raised ``results``: detected when the failures carry
    every declared finding (for a false-alarm control: when nothing fails)."""
    failed = failures(results)
    found = findings(results)
    if control.finds is None:
        detected = not failed
        message = "no alarm, as required" if detected else f"FALSE ALARM: {failed[0]}"
    else:
        missing = sorted(control.declared - found)
        detected = not missing
        caught = [result for result in failed if result.finding == control.finds]
        seen = ", ".join(map(str, sorted(found))) or "no failure"
        message = (
            caught[0].message
            if detected
            else f"NOT DETECTED: no {', '.join(map(str, missing))}; seen: {seen}"
        )
    return ControlOutcome(
        control.name, control.mechanism, control.finds, detected, message, failed, snapshot
    )


def summary(function: Callable[..., object]) -> str:
    """The first paragraph of ``function``'s docstring, on one line."""
    text = (function.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(text.replace("``", "`").split())


class Catalogue:
    """Controls in the order they are declared: ``@catalogue.control(...)`` on a mechanism's
    function declares a control that applies it (several on one function declare several)."""

    def __init__(self) -> None:
        self._controls: list[Control] = []

    @property
    def controls(self) -> tuple[Control, ...]:
        """Every control declared so far, in order."""
        return tuple(self._controls)

    def control(
        self,
        name: str,
        finds: Finding | None,
        effect: Effect,
        *,
        mechanism: str = "",
        also: Iterable[Finding] = (),
        reboot: bool = False,
        settle: bool = True,
        starts_from: StartingPoint = "clean",
        **footprint: Iterable[str],
    ) -> Callable[[Apply], Apply]:
        """Declare a control whose mechanism is the decorated function (returned unchanged).

        The mechanism in words is the function's docstring's first paragraph unless given;
        ``footprint`` names what it leaves behind by the parts of a ``Footprint`` (``files``,
        ``manager_variables``, ...).
        """
        left = Footprint(**{part: frozenset(names) for part, names in footprint.items()})

        def declare(apply: Apply) -> Apply:
            self._controls.append(
                Control(
                    name=name,
                    mechanism=mechanism or summary(apply),
                    finds=finds,
                    also=frozenset(also),
                    footprint=left,
                    apply=apply,
                    effect=effect,
                    reboot=reboot,
                    settle=settle,
                    starts_from=starts_from,
                )
            )
            return apply

        return declare
