"""The certification's data: gate results, the whole run, and its verdict and exit status.

Exit status of ``vmtests certify``: 0 certified, 1 a gate failed, 2 usage (the CLI), 3 the run
could not complete (preflight refused, host unreachable, a gate could not be judged, e.g. no
golden values, or the run was interrupted). ``CertificationResult`` is filled as the run goes,
so the report written in ``finally`` always shows how far it got.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vmtests.certify.arms import SwitchRecord
from vmtests.certify.loadgen import RequestRecord
from vmtests.contracts.status import ExitStatus, RunStatus
from vmtests.scenario.runner.versions import VersionTable

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
REPORTED = "reported"
"""A report-only gate (the determinism probe): it shows what it found and never fails."""
DEGENERATE_DETECTOR, GOLDEN_DETECTOR = "degenerate", "golden"
CERTIFY, RECORD, PROBE = "certify", "record-golden", "probe-determinism"
"""The run's mode (``options["mode"]``): judge the gates, record golden values, or probe how
deterministic the server's outputs are (report only)."""
"""A gate's status."""


@dataclass
class GateResult:
    """One gate: its status, the numbers it measured and a one-line summary."""

    name: str
    status: str = SKIPPED
    summary: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, problem: str) -> None:
        """Record a problem that fails the gate."""
        self.problems.append(problem)
        if self.status != ERROR:
            self.status = FAILED

    def error(self, problem: str) -> None:
        """Record why the gate could not be judged."""
        self.problems.append(problem)
        if self.status != FAILED:  # a definite failure stays a failure
            self.status = ERROR

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "numbers": self.numbers,
            "problems": self.problems,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class DetectorCounts:
    """How many responses one detector judged and how many it flagged (and why)."""

    judged: int = 0
    flagged: int = 0
    not_judged: int = 0
    """Responses it could not judge: no golden value for the golden comparison."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Flagged responses per reason: the degenerate rule, or the condition of a wrong output."""

    def count(self, flagged: bool, reasons: tuple[str, ...] = ()) -> None:
        """One judged response."""
        self.judged += 1
        self.flagged += int(flagged)
        for reason in reasons:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "judged": self.judged,
            "flagged": self.flagged,
            "not_judged": self.not_judged,
            "reasons": dict(sorted(self.reasons.items())),
        }


@dataclass
class CertificationResult:
    """Everything ``certificate.json`` holds; valid at every moment of the run."""

    profile: str
    target: str
    ab: str | None
    gates: list[GateResult] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    switches: list[SwitchRecord] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)
    versions: VersionTable = field(default_factory=VersionTable)
    """The versions the run used next to NixOS's (filled by the preflight gate)."""
    options: dict[str, Any] = field(default_factory=dict)
    status: RunStatus = RunStatus.RUNNING
    error: str = ""
    started_on: str = ""
    left_on: str = ""
    wall_seconds: float = 0.0
    loadgen_overhead: dict[str, float] = field(default_factory=dict)
    detectors: dict[str, DetectorCounts] = field(
        default_factory=lambda: {
            DEGENERATE_DETECTOR: DetectorCounts(),
            GOLDEN_DETECTOR: DetectorCounts(),
        }
    )
    unanswered: int = 0
    """Requests without a response to judge (an HTTP error, a timeout, a broken stream)."""

    def gate(self, name: str) -> GateResult | None:
        """The gate called ``name``, if it ran."""
        return next((gate for gate in self.gates if gate.name == name), None)

    @property
    def mode(self) -> str:
        """``CERTIFY``, ``RECORD`` or ``PROBE``."""
        return str(self.options.get("mode", CERTIFY))

    @property
    def exit_status(self) -> ExitStatus:
        """OK certified (or recorded, or probed), FAILED a gate failed, INCOMPLETE the run could
        not complete."""
        if any(gate.status == FAILED for gate in self.gates):
            return ExitStatus.FAILED
        if self.status != RunStatus.FINISHED or any(gate.status == ERROR for gate in self.gates):
            return ExitStatus.INCOMPLETE
        if (self.options.get("partial") and self.mode == CERTIFY) or not self.gates:
            return ExitStatus.INCOMPLETE
        return ExitStatus.OK  # also: golden values recorded, or the probe reported

    @property
    def verdict(self) -> str:
        """One line: CERTIFIED, NOT CERTIFIED (which gates) or INCOMPLETE (why); what a
        recording or a probe gave."""
        failed = [gate.name for gate in self.gates if gate.status == FAILED]
        errors = [gate.name for gate in self.gates if gate.status == ERROR]
        if failed:
            what = "GOLDEN NOT RECORDED" if self.mode == RECORD else "NOT CERTIFIED"
            return f"{what}: gate(s) failed: {', '.join(failed)}"
        if self.status == RunStatus.REFUSED:
            return f"INCOMPLETE: preflight refused: {self.error}"
        if self.status != RunStatus.FINISHED:
            return f"INCOMPLETE: run {self.status}: {self.error}"
        if errors:
            return f"INCOMPLETE: gate(s) could not be judged: {', '.join(errors)}"
        if self.mode == RECORD:
            recorded = self.gate("record_golden")
            summary = recorded.summary if recorded else "nothing recorded"
            return f"GOLDEN RECORDED for profile {self.profile}: {summary} (not a certificate)"
        if self.mode == PROBE:
            probe = self.gate("determinism")
            summary = probe.summary if probe else "no probe ran"
            return f"DETERMINISM PROBE (report only, not a certificate): {summary}"
        if self.options.get("partial"):
            return "INCOMPLETE: only some gates ran (--only); a partial run never certifies"
        return f"CERTIFIED: profile {self.profile} on {self.target}"
