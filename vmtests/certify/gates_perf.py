"""The performance gates: the interleaved A/B, the B=1 decode step, cold vs warm.

- A/B: ``blocks`` ABBA blocks; every arm run is a real switch to its configuration (installed,
  restarted through the unit with the stop checked, banners and digest verified), then the
  same frozen prompts and seed at concurrency 8. Per run: makespan, TTFT p95 and the decode
  step: the server's mean inter-token latency over the run (``/metrics`` deltas), with the
  client's view (median of the requests' mean steps) reported beside it. Each block gives one
  pair (mean of its two A runs, mean of its two B runs); the ratio B/A of each figure gets a
  paired bootstrap 95 % CI, and the decode step's ratio gets the advisory's decision
  (``stats.noise_band_decision``). Runs that were not interleaved are never compared.
- B=1 decode: a realistic prompt of several hundred tokens, ``decode_repeats`` times, each
  output's sha checked, so that the figure can be cited.
- Cold vs warm: a fresh server (restart through the unit, stop checked), then per size (8k,
  16k, 32k) the same prompts twice: cold, then warm. Makespan, TTFT p95 and the prefix-cache
  hit ratio (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` deltas,
  vLLM ``v1/metrics/loggers.py``) are reported per phase, never merged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vmtests.certify import prompts, stats
from vmtests.certify.arms import Configuration
from vmtests.certify.context import Context, spec
from vmtests.certify.gates import judge_records
from vmtests.certify.loadgen import BatchResult, RequestSpec
from vmtests.certify.model import ERROR, FAILED, PASSED, GateResult

AB_PATTERN = "ABBA"
MIN_BLOCKS = 2
MIN_DECODE_PROMPT_TOKENS = 256
HIT_COUNTER = "vllm:prefix_cache_hits_total"
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
QUERY_COUNTER = "vllm:prefix_cache_queries_total"


def run_figures(batch: BatchResult) -> dict[str, float]:
    """Makespan, TTFT p95 and the median per-request decode step of one batch (seconds)."""
    ttfts = [r.ttft for r in batch.records if r.ttft is not None]
    steps = [r.decode_step for r in batch.records if r.decode_step is not None]
    return {
        "makespan": batch.makespan,
        "ttft_p95": stats.percentile(ttfts, 95) if ttfts else float("nan"),
        "decode_step": stats.percentile(steps, 50) if steps else float("nan"),
    }


PAIRED = ("decode_step", "makespan", "ttft_p95")
"""The figures each ABBA block pairs (mean of its A runs, mean of its B runs)."""


@dataclass
class AbMeasurements:
    """What the A/B's runs measured: each run's figures, the per-block pairs of every paired
    figure, and the same-arm decode-step repeats (the measurement's own noise)."""

    runs: list[dict[str, object]] = field(default_factory=list)
    pairs: dict[str, tuple[list[float], list[float]]] = field(
        default_factory=lambda: {key: ([], []) for key in PAIRED}
    )
    repeats: list[tuple[float, float]] = field(default_factory=list)


def ab(ctx: Context) -> GateResult:
    """The interleaved A/B of ``ctx.base`` (A) against ``ctx.arm_b`` (B)."""
    gate = GateResult("ab")
    arms = _arms(ctx, gate)
    if arms is None:
        return gate
    specs = [spec(p, ctx.options.ab_tokens, ctx.options.seed) for p in prompts.ab_prompts()]
    measured = AbMeasurements()
    for block in range(ctx.options.ab_blocks):
        _run_block(ctx, gate, arms, specs, block=block + 1, measured=measured)
    gate.numbers.update(
        arms={arm: config.name for arm, config in arms.items()},
        pattern=AB_PATTERN,
        blocks=ctx.options.ab_blocks,
        concurrency=ctx.options.ab_concurrency,
        requests_per_run=len(specs),
        runs=measured.runs,
    )
    if gate.status == FAILED or not measured.pairs["decode_step"][0]:
        gate.summary = "A/B invalid: " + (gate.problems[0] if gate.problems else "no block")
        return gate
    _decide(gate, measured)
    return gate


def _arms(ctx: Context, gate: GateResult) -> dict[str, Configuration] | None:
    """The two arms, or None when the A/B cannot run as the advisory asks (``gate`` says why:
    not requested, too few blocks for a paired CI, an arm without prefix caching)."""
    if ctx.arm_b is None:
        gate.summary = "not requested (--ab)"
        return None
    if ctx.options.ab_blocks < MIN_BLOCKS:
        gate.error(f"{ctx.options.ab_blocks} block(s): a paired CI needs at least {MIN_BLOCKS}")
        return None
    arms = {"A": ctx.base, "B": ctx.arm_b}
    for arm, config in arms.items():
        # The advisory's A/B: prefix caching on in both arms (the profiles say so).
        if config.profile.module_banner.get("prefix-caching") != "on":
            gate.error(f"arm {arm} ({config.name}) does not expect prefix caching on")
    return None if gate.problems else arms


def _run_block(
    ctx: Context,
    gate: GateResult,
    arms: dict[str, Configuration],
    specs: list[RequestSpec],
    *,
    block: int,
    measured: AbMeasurements,
) -> None:
    """One ABBA block: four runs, each after a real switch; a complete block adds its pair."""
    per_arm: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for position, arm in enumerate(AB_PATTERN):
        label = f"block-{block}-{arm}{position + 1}"
        figures = _run_arm(ctx, gate, arms[arm], specs, label)
        if figures is not None:
            per_arm[arm].append(figures)
            measured.runs.append({"block": block, "arm": arm, "label": label, **figures})
    if len(per_arm["A"]) == 2 and len(per_arm["B"]) == 2:
        measured.repeats += [
            (per_arm[arm][0]["decode_step"], per_arm[arm][1]["decode_step"]) for arm in "AB"
        ]
        for key, (a_values, b_values) in measured.pairs.items():
            a_values.append(stats.mean([f[key] for f in per_arm["A"]]))
            b_values.append(stats.mean([f[key] for f in per_arm["B"]]))


def _run_arm(
    ctx: Context, gate: GateResult, config: Configuration, specs: list[RequestSpec], label: str
) -> dict[str, float] | None:
    """Switch to ``config`` and send the frozen prompts: the run's figures, or None (and a
    failed gate) when the switch did not hold."""
    switch = ctx.switch(config, reason=f"A/B {label}")
    if not switch.ok:
        gate.fail(f"{label}: switch to {config.name}: " + "; ".join(switch.failures))
        return None
    itl_before = _itl(ctx)
    batch = ctx.batch(specs, concurrency=ctx.options.ab_concurrency, stage="ab", label=label)
    itl_after = _itl(ctx)
    judge_records(gate, batch.records, ctx)
    figures = run_figures(batch)
    # The server's own inter-token latency (vLLM v1/metrics/loggers.py histogram): the decode
    # step without the network and the client's scheduling in it.
    figures["decode_step_client"] = figures["decode_step"]
    if itl_after[1] > itl_before[1]:
        figures["decode_step"] = (itl_after[0] - itl_before[0]) / (itl_after[1] - itl_before[1])
    return figures


def _decide(gate: GateResult, measured: AbMeasurements) -> None:
    """The paired bootstrap CIs of B/A and the advisory's noise-band decision on the decode
    step; an inconclusive decision fails the gate."""
    ratios = {
        key: stats.bootstrap_ratio_ci(a_values, b_values)
        for key, (a_values, b_values) in measured.pairs.items()
    }
    # The advisory's band is its hardware's measurement noise (~0.5 %); a noisier measurement
    # cannot resolve that, so the band is the larger of the two and both are reported.
    noise = stats.repeat_noise(measured.repeats)
    band = max(stats.NOISE_BAND, noise)
    decision = stats.noise_band_decision(ratios["decode_step"], band)
    gate.numbers.update(
        ratios={key: estimate.to_dict() for key, estimate in ratios.items()},
        decision=decision.verdict,
        decision_text=decision.text,
        advisory_noise_band=stats.NOISE_BAND,
        measured_noise_band=noise,
        noise_band=band,
    )
    if decision.verdict == "inconclusive":
        gate.fail(decision.text)
    elif gate.status != ERROR:
        gate.status = PASSED
    gate.summary = f"decode step {decision.text}"
    if noise > stats.NOISE_BAND:
        warning = (
            f"this run's measured noise ({noise:.1%}) exceeds the advisory's "
            f"{stats.NOISE_BAND:.1%} band: it cannot resolve an effect that small"
        )
        gate.numbers["noise_warning"] = warning
        gate.summary += f"; NOTE: {warning}"


def decode_b1(ctx: Context) -> GateResult:
    """The B=1 decode step with a realistic prompt, each output's sha checked."""
    gate = GateResult("decode_b1")
    request = spec(prompts.DECODE, ctx.options.decode_tokens)
    records = []
    for repeat in range(ctx.options.decode_repeats):
        batch = ctx.batch([request], concurrency=1, stage="decode_b1", label=f"run-{repeat + 1}")
        records += batch.records
    judge_records(gate, records, ctx)
    steps = [r.decode_step for r in records if r.decode_step is not None]
    gate.numbers.update(
        prompt_tokens=records[0].prompt_tokens if records else None,
        output_tokens=request.max_tokens,
        repeats=len(records),
        decode_step_ms=[1000 * s for s in steps],
        decode_step_mean_ms=1000 * stats.mean(steps) if steps else None,
        output_shas=sorted({r.output_sha for r in records}),
    )
    prompt_tokens = gate.numbers["prompt_tokens"] or 0
    if prompt_tokens < MIN_DECODE_PROMPT_TOKENS:
        gate.fail(
            f"the server counted {prompt_tokens} prompt tokens: a decode figure from a prompt "
            f"under {MIN_DECODE_PROMPT_TOKENS} tokens cannot be cited (the advisory's 26-token one)"
        )
    if len(gate.numbers["output_shas"]) > 1:
        gate.fail("the same greedy prompt gave different outputs across repeats")
    if not gate.problems:
        gate.status = PASSED
    mean_ms = gate.numbers["decode_step_mean_ms"]
    gate.summary = (
        f"{mean_ms:.2f} ms/step over {len(steps)} runs, "
        f"prompt {gate.numbers['prompt_tokens']} tokens"
        if mean_ms is not None
        else "no decode step measured"
    )
    return gate


def counter_total(metrics_text: str, name: str) -> float:
    """The sum of a Prometheus counter over all its label sets."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _counters(ctx: Context) -> tuple[float, float]:
    status, text = ctx.generator.get("/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return counter_total(text, HIT_COUNTER), counter_total(text, QUERY_COUNTER)


def _itl(ctx: Context) -> tuple[float, float]:
    """(sum, count) of the server's inter-token latency histogram."""
    status, text = ctx.generator.get("/metrics")
    if status != 200:
        return 0.0, 0.0
    return counter_total(text, ITL_SUM), counter_total(text, ITL_COUNT)


def cold_warm(ctx: Context) -> GateResult:
    """Cold (fresh server) then warm, per prompt size, with the prefix-cache hit ratio."""
    gate = GateResult("cold_warm")
    outcome = ctx.restart()
    gate.numbers["restart_stop"] = outcome.to_dict()
    if not outcome.ok:
        gate.fail(f"restart for the cold phase: {outcome.message}")
        gate.summary = outcome.message
        return gate
    sets = prompts.long_prompts()
    phases: dict[str, dict[str, dict[str, float | int | None]]] = {"cold": {}, "warm": {}}
    for phase, figures in phases.items():
        for size, prompt_set in sets.items():
            specs = [spec(p, ctx.options.long_tokens) for p in prompt_set]
            hits0, queries0 = _counters(ctx)
            batch = ctx.batch(
                specs, concurrency=len(specs), stage="cold_warm", label=f"{phase}-{size}"
            )
            hits1, queries1 = _counters(ctx)
            judge_records(gate, batch.records, ctx)
            queried = queries1 - queries0
            figures[size] = {
                **run_figures(batch),
                "prompt_tokens": max((r.prompt_tokens or 0) for r in batch.records),
                "prefix_cache_hit_ratio": (hits1 - hits0) / queried if queried else None,
            }
    gate.numbers["phases"] = phases
    if not gate.problems:
        gate.status = PASSED
    parts = []
    for size in sets:
        cold, warm = phases["cold"][size], phases["warm"][size]
        parts.append(
            f"{size}: cold {cold['makespan']:.2f} s (hit {_ratio(cold)}) / "
            f"warm {warm['makespan']:.2f} s (hit {_ratio(warm)})"
        )
    gate.summary = "; ".join(parts)
    return gate


def _ratio(figures: dict[str, float | int | None]) -> str:
    value = figures.get("prefix_cache_hit_ratio")
    return "n/a" if value is None else f"{float(value):.1%}"
