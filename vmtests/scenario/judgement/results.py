"""``CheckResult``: one verdict, shared by checks, scenario, controls and reports.

A result is keyed by its ``Check`` and, when it fails, its ``Reason``
(``vmtests.contracts.findings``); its message is for people and nothing matches on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vmtests.contracts.findings import Check, Finding, Reason

STAGE_PHRASES = {
    "S0": "in the base boot (S0)",
    "S1": "after the switch (S1)",
    "S2": "after the reboot (S2)",
}


def stage_phrase(stage: str) -> str:
    """How a message names a stage: ``after the reboot (S2)``; unknown labels pass through."""
    return STAGE_PHRASES.get(stage, f"at {stage}")


@dataclass(frozen=True)
class CheckResult:
    """One check of one subject at one stage.

    ``check`` groups results (``profile.args``, ``consistency``, ``source.runtime-drop-in``,
    ...), ``subject`` names the flag, variable, banner or field, ``reason`` says why a failed
    result failed, and ``message`` says what held or exactly what did not. ``informational``
    results are reported but never fail a run (the target profile checked against the base boot
    S0, for instance); ``base`` marks a result of the base profile's expectations (S0), not the
    target's.
    """

    stage: str
    check: Check
    subject: str
    ok: bool
    message: str
    informational: bool = False
    reason: Reason | None = None
    base: bool = False

    @property
    def failed(self) -> bool:
        """True when this result fails the run."""
        return not self.ok and not self.informational

    @property
    def finding(self) -> Finding | None:
        """The check and reason of a result that did not hold; None for one that held."""
        return None if self.ok or self.reason is None else Finding(self.check, self.reason)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        verdict = "ok" if self.ok else ("info" if self.informational else "FAIL")
        check = f"base {self.check}" if self.base else str(self.check)
        reason = f" ({self.reason})" if self.reason and not self.ok else ""
        return f"[{verdict}] {self.stage} {check}{reason} {self.subject}: {self.message}"


def passed(stage: str, check: Check, subject: str, message: str) -> CheckResult:
    """A result that holds."""
    return CheckResult(stage, check, subject, True, message)


def failed(stage: str, check: Check, subject: str, reason: Reason, message: str) -> CheckResult:
    """A result that does not hold, for ``reason``; ``message`` is prefixed with the stage
    phrase."""
    return CheckResult(
        stage, check, subject, False, f"{stage_phrase(stage)}: {message}", reason=reason
    )


def as_informational(results: list[CheckResult]) -> list[CheckResult]:
    """The same results, marked as not failing the run."""
    return [dataclasses.replace(result, informational=True) for result in results]


def failures(results: list[CheckResult]) -> list[CheckResult]:
    """The results that fail a run."""
    return [result for result in results if result.failed]


def findings(results: list[CheckResult]) -> set[Finding]:
    """The distinct findings of the results that fail a run."""
    return {found for result in failures(results) if (found := result.finding) is not None}
