"""What every gate works with: the machine, the endpoint, the configurations and the judging.

``Context.batch`` sends requests through the load generator, applies the degenerate-output
detector to every response and compares every output with its golden value, records every
request in the result, and keeps track of which configuration the host is on, so that an
interrupted run can put it back (or say exactly where it is).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vmtests.certify import degenerate, hostops
from vmtests.certify.arms import Configuration, SwitchRecord, switch_to
from vmtests.certify.golden import GoldenMissing, GoldenRecorder, GoldenStore, condition
from vmtests.certify.loadgen import (
    DEGENERATE,
    UNREPRODUCIBLE,
    WRONG_OUTPUT,
    BatchResult,
    LoadGenerator,
    RequestRecord,
    RequestSpec,
    run_batch,
)
from vmtests.certify.model import DEGENERATE_DETECTOR, GOLDEN_DETECTOR, CertificationResult
from vmtests.certify.prompts import Prompt
from vmtests.contracts.serving import MIN_DISK_GIB, MIN_MEM_AVAILABLE_GIB
from vmtests.contracts.settings import Settings
from vmtests.driver.machine import Machine
from vmtests.scenario.install.switching import Switcher

MIN_REQUESTS = 256
WAVE_WIDTH = 32


@dataclass
class Options:
    """The knobs of a run (the CLI's flags); defaults are the owner's gates."""

    requests: int = MIN_REQUESTS
    wave_width: int = WAVE_WIDTH
    ab_blocks: int = 3
    ab_concurrency: int = 8
    min_mem_gib: float = MIN_MEM_AVAILABLE_GIB
    min_disk_gib: float = MIN_DISK_GIB
    correctness_tokens: int = 48
    concurrency_tokens: int = 32
    ab_tokens: int = 64
    decode_tokens: int = 128
    decode_repeats: int = 3
    long_tokens: int = 16
    seed: int = 0
    only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The advisory's trap: never certify a boot with less than ~4 GB available.
        self.min_mem_gib = max(MIN_MEM_AVAILABLE_GIB, self.min_mem_gib)


def spec(prompt: Prompt, max_tokens: int, seed: int = 0) -> RequestSpec:
    """A greedy (temperature 0) request for ``prompt``."""
    return RequestSpec(prompt.id, prompt.text, max_tokens, seed=seed, temperature=0.0)


@dataclass
class Context:
    """The state shared by the gates of one run."""

    machine: Machine
    generator: LoadGenerator
    switcher: Switcher
    base: Configuration
    result: CertificationResult
    options: Options
    golden: GoldenStore | None
    settings: Settings
    arm_b: Configuration | None = None
    current: str = ""
    report_dir: Path | None = None
    recorder: GoldenRecorder | None = None
    """Set in a recording run: outputs are recorded per condition instead of judged."""
    golden_problems: list[str] = field(default_factory=list)
    sent: set[str] = field(default_factory=set)
    """Prompts sent since the server last (re)started, as far as this run knows: a second send
    is ``warm`` (it may hit the prefix cache), the first ``cold``."""
    touched: bool = False
    """True once the run switched or restarted anything: only then is there a start to restore."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def judge(self, record: RequestRecord, request: RequestSpec) -> None:
        """Apply the detector and the golden comparison (or recording) to one response; the
        findings go on the record, the counts into the result (thread-safe)."""
        with self._lock:
            self._judge(record, request)

    def _judge(self, record: RequestRecord, request: RequestSpec) -> None:
        detectors = self.result.detectors
        if record.status != 200 or record.error:
            self.result.unanswered += 1
            return
        findings = degenerate.inspect(record.text, request.prompt)
        detectors[DEGENERATE_DETECTOR].count(bool(findings), tuple(f.rule for f in findings))
        if findings:
            record.add_finding(DEGENERATE, "degenerate output: " + degenerate.describe(findings))
        if self.recorder is not None:
            if findings:
                return  # a degenerate output is never a golden value
            problem = self.recorder.add(request, record.condition, record.output_sha)
            if problem:
                record.add_finding(UNREPRODUCIBLE, problem)
            return
        if self.golden is None:
            return
        try:
            verdict = self.golden.judge(request, record.output_sha, record.condition)
        except GoldenMissing as missing:
            detectors[GOLDEN_DETECTOR].not_judged += 1
            if str(missing) not in self.golden_problems:
                self.golden_problems.append(str(missing))
            return
        detectors[GOLDEN_DETECTOR].count(not verdict.ok, () if verdict.ok else (record.condition,))
        if not verdict.ok:
            record.add_finding(WRONG_OUTPUT, f"wrong output: {verdict.message}")

    def batch(
        self, specs: Sequence[RequestSpec], *, concurrency: int, stage: str, label: str
    ) -> BatchResult:
        """Send ``specs`` (at most ``concurrency`` at once), judge and record every response,
        each under its condition (how many were sent together, and cold or warm)."""
        by_id = {request.prompt_id: request for request in specs}
        together = max(1, min(concurrency, len(specs)))
        conditions = {i: condition(together, i in self.sent) for i in by_id}

        def judge(record: RequestRecord) -> None:
            record.condition = conditions[record.prompt_id]
            self.judge(record, by_id[record.prompt_id])

        batch = run_batch(
            self.generator,
            specs,
            concurrency=concurrency,
            stage=stage,
            label=label,
            first_index=len(self.result.requests),
            on_record=judge,
        )
        self.sent.update(by_id)
        self.result.requests.extend(batch.records)
        return batch

    def restart(self) -> hostops.StopOutcome:
        """Stop (checked) and start the serving unit: a fresh server, a cold prefix cache."""
        self.touched = True
        where, self.current = (
            self.current,
            f"unknown (restarting the serving unit on {self.current})",
        )
        outcome = hostops.restart_checked(self.machine, self.settings)
        self.current = where
        self.sent.clear()
        return outcome

    def switch(self, config: Configuration, reason: str) -> SwitchRecord:
        """Switch to ``config`` (a real switch and checked restart); track where the host is."""
        self.touched = True
        self.sent.clear()
        self.current = f"unknown (switching to {config.name})"
        record = switch_to(
            self.machine,
            self.switcher,
            config,
            settings=self.settings,
            reason=reason,
        )
        self.current = config.name
        self.result.switches.append(record)
        return record
