"""The correctness gates: preflight, smoke and extended correctness, the concurrency bound.

Each gate returns a ``GateResult`` with its numbers. The preflight refuses (status ``error``,
exit 3) before anything is touched; the others fail (exit 1) on any bad response.
"""

from __future__ import annotations

import math
from collections import Counter

from vmtests.certify import hostops, prompts, stats
from vmtests.certify.context import MIN_REQUESTS, Context, spec
from vmtests.certify.loadgen import RequestRecord
from vmtests.certify.model import ERROR, FAILED, PASSED, GateResult
from vmtests.contracts.serving import GIB_KIB
from vmtests.scenario.collection.collect import take_snapshot
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.runner.versions import VersionTable, read_versions, stands_in_for

DEFECT_RATE = 1 / 128


def preflight(ctx: Context) -> GateResult:
    """Memory, tt-smi, device holders, disk, unit and persistence checks; refuses on any."""
    gate = GateResult("preflight")
    options, machine = ctx.options, ctx.machine
    mem = hostops.mem_available_kib(machine) / GIB_KIB
    disk = hostops.disk_free_kib(machine) / GIB_KIB
    gate.numbers.update(
        mem_available_gib=round(mem, 3),
        min_mem_available_gib=options.min_mem_gib,
        disk_free_gib=round(disk, 3),
        min_disk_free_gib=options.min_disk_gib,
    )
    if mem < options.min_mem_gib:
        gate.error(f"MemAvailable is {mem:.2f} GiB, below the {options.min_mem_gib:.1f} GiB floor")
    if disk < options.min_disk_gib:
        gate.error(f"only {disk:.2f} GiB free on /, below {options.min_disk_gib:.1f} GiB")
    # tt-smi runs once, below, as hostops.tt_smi_snapshot (its JSON); not in the snapshot too.
    snapshot = take_snapshot(
        machine,
        "preflight",
        port=ctx.settings.serving_port,
        container=ctx.settings.container,
        card=False,
        api_key_file=ctx.settings.api_key_file,
    )
    smi: dict[str, object] = {}
    try:
        smi = hostops.tt_smi_snapshot(machine)
    except ValueError as error:
        gate.error(str(error))
    identity = hostops.identity(machine, snapshot, smi)
    ctx.result.identity = identity
    ctx.result.versions = VersionTable(
        read_versions(machine, ctx.settings.serving_port),
        stands_in_for(ctx.base.profile.serving_profile, ctx.result.target),
    )
    boards = [board["board_type"] for board in identity["boards"]]
    gate.numbers.update(boards=boards, driver=identity["driver"])
    if smi and not any(str(board).lower().startswith("p150") for board in boards):
        gate.error(f"tt-smi names no p150 board (boards: {boards or 'none'})")
    if smi and not identity["driver"]:
        gate.error("tt-smi reports no driver version")
    unknown = hostops.holders_not_inspectable(smi) if smi else ""
    if unknown:
        gate.numbers["device_holders_not_inspectable"] = unknown
    judged = bool(smi) and not unknown
    holders = hostops.device_holders(machine, smi, ctx.settings.container) if judged else []
    gate.numbers["other_device_holders"] = holders
    if holders:
        gate.error("processes other than the serving unit hold the device: " + "; ".join(holders))
    failures = [str(r) for r in evaluate_stage(ctx.base.profile, snapshot) if r.failed]
    digest = identity["config_digest"]
    if digest != ctx.base.digest:
        failures.append(f"module banner digest {digest or '(none)'} is not {ctx.base.digest}")
    gate.numbers.update(persistence_failures=len(failures), config_digest=digest)
    for failure in failures:
        gate.error(f"persistence check: {failure}")
    ctx.current = ctx.base.name if not failures else f"as found (not {ctx.base.name})"
    if gate.status != ERROR:
        gate.status = PASSED
    held = f"holders not inspectable ({unknown})" if unknown else f"{len(holders)} other holder(s)"
    gate.summary = (
        f"MemAvailable {mem:.2f} GiB, {', '.join(boards) or 'no board'}, "
        f"{identity['driver'] or 'no driver'}, {held}, {len(failures)} persistence failure(s)"
    )
    return gate


def judge_records(gate: GateResult, records: list[RequestRecord], ctx: Context) -> int:
    """Fail ``gate`` for each bad record; error it when golden values are missing."""
    bad = [record for record in records if not record.ok]
    for record in bad:
        reason = record.error or "; ".join(record.findings) or "empty output"
        gate.fail(f"{record.prompt_id} (request {record.index}): {reason}")
    for problem in ctx.golden_problems:
        gate.error(f"golden: {problem}")
    ctx.golden_problems.clear()
    return len(bad)


def correctness(ctx: Context, name: str, prompt_set: tuple[prompts.Prompt, ...]) -> GateResult:
    """Send each fixed prompt once at B=1 and temperature 0; every sha must equal its golden."""
    gate = GateResult(name)
    specs = [spec(prompt, ctx.options.correctness_tokens) for prompt in prompt_set]
    batch = ctx.batch(specs, concurrency=1, stage=name, label=name)
    bad = judge_records(gate, batch.records, ctx)
    gate.numbers.update(prompts=len(specs), passed=len(specs) - bad, failed=bad)
    gate.numbers["outputs"] = {r.prompt_id: r.output_sha for r in batch.records}
    if not gate.problems:
        gate.status = PASSED
    gate.summary = f"{len(specs) - bad}/{len(specs)} PASS"
    return gate


def failure_kind(record: RequestRecord) -> str:
    """A short class of a failed request: http-500, timeout, degenerate, wrong-output..."""
    if record.error_kind:
        return record.error_kind
    if record.status is not None and record.status != 200:
        return f"http-{record.status}"
    if not record.text:
        return "empty"
    return record.finding_kinds[0] if record.finding_kinds else "error"


def bound_numbers(failures: int, n: int) -> dict[str, float | int]:
    """The bound's numbers for ``failures`` of ``n``."""
    upper = stats.clopper_pearson_upper(failures, n)
    return {
        "n": n,
        "failures": failures,
        "failure_rate": failures / n,
        "clopper_pearson_upper_95": upper,
        "rule_of_three_upper": 3 / n,
        "p_detect_1_in_128": stats.detection_probability(DEFECT_RATE, n),
    }


def concurrency(ctx: Context) -> GateResult:
    """At least 8 waves x 32 concurrent requests; pass = 0 failures and n >= 256."""
    gate = GateResult("concurrency")
    width, n = ctx.options.wave_width, ctx.options.requests
    pool = prompts.concurrency_prompts()
    records: list[RequestRecord] = []
    waves = math.ceil(n / width)
    for wave in range(waves):
        count = min(width, n - wave * width)
        specs = [spec(pool[i % len(pool)], ctx.options.concurrency_tokens) for i in range(count)]
        batch = ctx.batch(specs, concurrency=width, stage="concurrency", label=f"wave-{wave + 1}")
        records += batch.records
    bad = [record for record in records if not record.ok]
    gate.numbers.update(bound_numbers(len(bad), len(records)))
    gate.numbers.update(
        waves=waves,
        wave_width=width,
        failure_kinds=dict(Counter(failure_kind(record) for record in bad)),
        min_requests=MIN_REQUESTS,
    )
    judge_records(gate, records, ctx)
    if len(records) < MIN_REQUESTS:
        gate.fail(
            f"only {len(records)} requests: the gate needs at least {MIN_REQUESTS} "
            "(8 waves x 32) to pass"
        )
    if not gate.problems:
        gate.status = PASSED
    upper = gate.numbers["clopper_pearson_upper_95"]
    detect = gate.numbers["p_detect_1_in_128"]
    gate.summary = (
        f"{len(bad)}/{len(records)} failed; 95 % upper bound {upper:.2%}; "
        f"P(catch a 1/128 defect) {detect:.1%}"
    )
    if gate.status == FAILED and len(gate.problems) > 12:
        gate.problems = [*gate.problems[:12], f"... and {len(gate.problems) - 12} more"]
    return gate
