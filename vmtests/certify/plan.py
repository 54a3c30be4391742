"""``vmtests certify --plan``: every step the run would take, and a time budget; changes nothing.

The budget uses the hardware-like figures of the stub's latency table (``vmtests/stub/latency.py``:
the B=1 decode control of 48.6 ms, 4 ms per uncached prompt token, 3 % step growth per extra
running sequence) and a restart time per target (``restart_seconds``), so it is an estimate of
the order of magnitude, printed with its assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vmtests.certify import determinism, prompts
from vmtests.certify.context import Options
from vmtests.certify.gates_perf import AB_PATTERN
from vmtests.certify.model import CERTIFY, PROBE, RECORD
from vmtests.stub import latency

ALL_GATES = ("preflight", "smoke", "extended", "concurrency", "ab", "decode_b1", "cold_warm")


@dataclass(frozen=True)
class Step:
    """One planned step: the gate, what it does, how many requests, restarts and seconds."""

    gate: str
    action: str
    requests: int = 0
    restarts: int = 0
    seconds: float = 0.0


def _request_seconds(prompt_tokens: int, output_tokens: int, running: int = 1) -> float:
    prefill = latency.PREFILL_FIXED_MS + prompt_tokens * latency.PREFILL_UNCACHED_MS_PER_TOKEN
    step = latency.DECODE_STEP_MS * (1 + latency.BATCH_GROWTH_PER_SEQ * (running - 1))
    return (prefill + output_tokens * step) / 1000


def build_plan(
    options: Options,
    *,
    profile: str,
    ab_profile: str | None,
    switch: str,
    mode: str = CERTIFY,
    restart_seconds: float = 300.0,
) -> list[Step]:
    """The steps of a run with these options (``options.only`` limits the gates): a
    certification, a recording of golden values (the gates replayed on ``profile`` alone, every
    output recorded per condition) or the report-only determinism probe."""
    steps = [_preflight(options, profile)]
    if mode == PROBE:
        return [*steps, _determinism(options)]
    wanted = set(options.only or ALL_GATES)
    ab_profile = None if mode == RECORD else ab_profile
    steps += [_correctness(options, name, mode) for name in ("smoke", "extended") if name in wanted]
    if "concurrency" in wanted:
        steps.append(_concurrency(options, profile))
    if "ab" in wanted and mode == RECORD:
        steps.append(_ab_recorded(options, profile))
    if "ab" in wanted and ab_profile:
        steps.append(_ab(options, profile, ab_profile, switch, restart_seconds))
    if "decode_b1" in wanted:
        steps.append(_decode_b1(options))
    if "cold_warm" in wanted:
        steps.append(_cold_warm(options, restart_seconds))
    if mode == RECORD:
        steps.append(_record_golden(profile))
    if "ab" in wanted and ab_profile:
        steps.append(Step("finish", f"the host ends on {profile} (each ABBA block ends on A)"))
    return steps


def _preflight(options: Options, profile: str) -> Step:
    return Step(
        "preflight",
        "read only: MemAvailable >= "
        f"{options.min_mem_gib:.0f} GiB, df /, tt-smi -s (p150, driver, device holders), "
        f"serving unit active, persistence checks of profile {profile}, config digest",
        seconds=30,
    )


def _determinism(options: Options) -> Step:
    b1 = determinism.B1_SENDS * len(prompts.SMOKE)
    count = b1 + determinism.REPEATS * sum(determinism.BATCHES)
    seconds = b1 * _request_seconds(40, options.correctness_tokens) + determinism.REPEATS * sum(
        _request_seconds(60, options.correctness_tokens, width) for width in determinism.BATCHES
    )
    return Step(
        "determinism",
        f"report only: the {len(prompts.SMOKE)} smoke prompts at B=1 {determinism.B1_SENDS} "
        f"times (cold, warm, warm), then with fillers at "
        f"B={'/'.join(map(str, determinism.BATCHES))} {determinism.REPEATS} times each; which "
        "outputs differ and how (no golden values)",
        count,
        0,
        seconds,
    )


def _record_golden(profile: str) -> Step:
    return Step(
        "record_golden",
        "write every output's sha per condition (batch size, cold or warm) to "
        f"vmtests/certify/golden/{profile}.json, only if every step passed",
    )


def _ab_recorded(options: Options, profile: str) -> Step:
    per_run = len(prompts.ab_prompts())
    rounds = math.ceil(per_run / options.ab_concurrency)
    return Step(
        "ab",
        f"the A/B's {per_run} prompts once at concurrency {options.ab_concurrency} on {profile} "
        "(recorded; no switch)",
        per_run,
        0,
        rounds * _request_seconds(200, options.ab_tokens, options.ab_concurrency),
    )


def _correctness(options: Options, name: str, mode: str) -> Step:
    count = len(prompts.SMOKE if name == "smoke" else prompts.EXTENDED)
    seconds = count * _request_seconds(40, options.correctness_tokens)
    judged = "recorded per condition" if mode == RECORD else "vs golden (per condition)"
    return Step(name, f"{count} fixed prompts, B=1, temperature 0, sha {judged}", count, 0, seconds)


def _concurrency(options: Options, profile: str) -> Step:
    waves = math.ceil(options.requests / options.wave_width)
    wave = _request_seconds(60, options.concurrency_tokens, options.wave_width)
    return Step(
        "concurrency",
        f"{waves} waves x {options.wave_width} concurrent = {options.requests} requests on "
        f"{profile} (pass: 0 failures, n >= 256)",
        options.requests,
        0,
        waves * wave,
    )


def _ab(
    options: Options, profile: str, ab_profile: str, switch: str, restart_seconds: float
) -> Step:
    runs = options.ab_blocks * len(AB_PATTERN)
    per_run = len(prompts.ab_prompts())
    rounds = math.ceil(per_run / options.ab_concurrency)
    run_seconds = rounds * _request_seconds(200, options.ab_tokens, options.ab_concurrency)
    return Step(
        "ab",
        f"{options.ab_blocks} x {AB_PATTERN} blocks: {runs} switches ({switch}; systemctl stop, "
        "exit status checked, systemctl start; banners and digest verified), "
        f"A={profile} B={ab_profile}, {per_run} requests at concurrency "
        f"{options.ab_concurrency} per run",
        runs * per_run,
        runs,
        runs * (restart_seconds + run_seconds),
    )


def _decode_b1(options: Options) -> Step:
    return Step(
        "decode_b1",
        f"{options.decode_repeats} x B=1 decode of {options.decode_tokens} tokens on a "
        "~500-token prompt, sha checked",
        options.decode_repeats,
        0,
        options.decode_repeats * _request_seconds(500, options.decode_tokens),
    )


def _cold_warm(options: Options, restart_seconds: float) -> Step:
    per_size = 2
    seconds = restart_seconds + 2 * sum(
        _request_seconds(t, options.long_tokens, per_size) for t in prompts.LONG_SIZES.values()
    )
    return Step(
        "cold_warm",
        "1 restart (systemctl stop, exit status checked, start), then "
        f"{per_size} prompts per size ({', '.join(prompts.LONG_SIZES)}) cold, then warm; "
        "hit ratio from /metrics per phase",
        2 * per_size * len(prompts.LONG_SIZES),
        1,
        seconds,
    )


def render_plan(steps: list[Step]) -> str:
    """The plan as text: one line per step, then the totals."""
    lines = []
    for number, step in enumerate(steps, 1):
        lines.append(
            f"{number}. [{step.gate}] {step.action}\n     requests {step.requests}, restarts "
            f"{step.restarts}, about {step.seconds / 60:.1f} min"
        )
    total = sum(step.seconds for step in steps)
    lines.append(
        f"total: {sum(s.requests for s in steps)} requests, {sum(s.restarts for s in steps)} "
        f"restarts, time budget about {total / 60:.0f} min (hardware-like latency figures)"
    )
    return "\n".join(lines)
