"""``CheckResult``: one verdict with a precise message, shared by checks, scenario and reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
    ...), ``subject`` names the flag, variable, banner or field, and ``message`` says what held
    or exactly what did not. ``informational`` results are reported but never fail a run (the
    target profile checked against the base boot S0, for instance).
    """

    stage: str
    check: str
    subject: str
    ok: bool
    message: str
    informational: bool = False

    @property
    def failed(self) -> bool:
        """True when this result fails the run."""
        return not self.ok and not self.informational

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return asdict(self)

    def __str__(self) -> str:
        verdict = "ok" if self.ok else ("info" if self.informational else "FAIL")
        return f"[{verdict}] {self.stage} {self.check} {self.subject}: {self.message}"


def passed(stage: str, check: str, subject: str, message: str) -> CheckResult:
    """A result that holds."""
    return CheckResult(stage, check, subject, True, message)


def failed(stage: str, check: str, subject: str, message: str) -> CheckResult:
    """A result that does not hold; ``message`` is prefixed with the stage phrase."""
    return CheckResult(stage, check, subject, False, f"{stage_phrase(stage)}: {message}")


def as_informational(results: list[CheckResult]) -> list[CheckResult]:
    """The same results, marked as not failing the run."""
    return [
        CheckResult(r.stage, r.check, r.subject, r.ok, r.message, informational=True)
        for r in results
    ]
