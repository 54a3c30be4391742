"""What every gate works with: the machine, the endpoint, the configurations and the judging.

``Context.batch`` sends requests through the load generator, applies the degenerate-output
detector to every response and compares every output with its golden value, records every
request in the result, and keeps track of which configuration the host is on, so that an
interrupted run can put it back (or say exactly where it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vmtests.certify import degenerate
from vmtests.certify.arms import Configuration, SwitchRecord, switch_to
from vmtests.certify.golden import GoldenMissing, GoldenStore
from vmtests.certify.loadgen import (
    DEGENERATE,
    WRONG_OUTPUT,
    BatchResult,
    LoadGenerator,
    RequestRecord,
    RequestSpec,
    run_batch,
)
from vmtests.certify.model import CertificationResult
from vmtests.certify.prompts import Prompt
from vmtests.driver.machine import Machine
from vmtests.scenario.install.switching import Switcher

MIN_MEM_GIB = 4.0
MIN_REQUESTS = 256
WAVE_WIDTH = 32


@dataclass
class Options:
    """The knobs of a run (the CLI's flags); defaults are the owner's gates."""

    requests: int = MIN_REQUESTS
    wave_width: int = WAVE_WIDTH
    ab_blocks: int = 3
    ab_concurrency: int = 8
    min_mem_gib: float = MIN_MEM_GIB
    min_disk_gib: float = 1.0
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
        self.min_mem_gib = max(MIN_MEM_GIB, self.min_mem_gib)


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
    port: int
    arm_b: Configuration | None = None
    container: str | None = None
    current: str = ""
    report_dir: Path | None = None
    api_key_file: str | None = None
    golden_problems: list[str] = field(default_factory=list)

    def judge(self, record: RequestRecord, request: RequestSpec) -> None:
        """Apply the detector and the golden comparison to one response (findings on it)."""
        if record.status != 200 or record.error:
            return
        findings = degenerate.inspect(record.text, request.prompt)
        if findings:
            record.add_finding(DEGENERATE, "degenerate output: " + degenerate.describe(findings))
        if self.golden is None:
            return
        try:
            verdict = self.golden.judge(request, record.output_sha)
        except GoldenMissing as missing:
            if str(missing) not in self.golden_problems:
                self.golden_problems.append(str(missing))
            return
        if not verdict.ok:
            record.add_finding(WRONG_OUTPUT, f"wrong output: {verdict.message}")

    def batch(
        self, specs: Sequence[RequestSpec], *, concurrency: int, stage: str, label: str
    ) -> BatchResult:
        """Send ``specs`` (at most ``concurrency`` at once), judge and record every response."""
        by_id = {request.prompt_id: request for request in specs}
        batch = run_batch(
            self.generator,
            specs,
            concurrency=concurrency,
            stage=stage,
            label=label,
            first_index=len(self.result.requests),
            on_record=lambda record: self.judge(record, by_id[record.prompt_id]),
        )
        self.result.requests.extend(batch.records)
        return batch

    def switch(self, config: Configuration, reason: str) -> SwitchRecord:
        """Switch to ``config`` (a real switch and checked restart); track where the host is."""
        self.current = f"unknown (switching to {config.name})"
        record = switch_to(
            self.machine,
            self.switcher,
            config,
            port=self.port,
            reason=reason,
            container=self.container,
            api_key_file=self.api_key_file,
        )
        self.current = config.name
        self.result.switches.append(record)
        return record
