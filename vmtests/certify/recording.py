"""Recording golden values: the gates themselves, with every output recorded under its condition
instead of judged, then written once every gate passed.

The recording replays the gates (``run.py`` swaps the A/B, which needs a second arm, for
``ab_outputs``: the A/B's prompts sent once at its concurrency on the current configuration, as
each arm sends them after its switch), so it holds exactly the conditions a certification run
judges (``vmtests.certify.golden``). An output that is degenerate, or that differs from an
earlier output of the same prompt under the same condition, fails its gate: nothing is
written then.
"""

from __future__ import annotations

from vmtests.certify import prompts
from vmtests.certify.context import Context, spec
from vmtests.certify.gates import judge_records
from vmtests.certify.golden import GoldenStore
from vmtests.certify.model import ERROR, PASSED, GateResult


def ab_outputs(ctx: Context) -> GateResult:
    """The A/B's prompts and seed, once at its concurrency on the configuration under test."""
    gate = GateResult("ab")
    specs = [spec(p, ctx.options.ab_tokens, ctx.options.seed) for p in prompts.ab_prompts()]
    batch = ctx.batch(specs, concurrency=ctx.options.ab_concurrency, stage="ab", label="record")
    bad = judge_records(gate, batch.records, ctx)
    gate.numbers.update(prompts=len(specs), concurrency=ctx.options.ab_concurrency, failed=bad)
    if not gate.problems:
        gate.status = PASSED
    gate.summary = (
        f"{len(specs) - bad}/{len(specs)} recorded at concurrency {ctx.options.ab_concurrency}"
    )
    return gate


def write_golden(ctx: Context, store: GoldenStore) -> GateResult:
    """Write what the gates recorded, only when every gate before passed."""
    gate = GateResult("record_golden")
    recorder = ctx.recorder
    failed = [g.name for g in ctx.result.gates[1:] if g.status != PASSED]
    if recorder is None or not recorder.shas:
        gate.error("no output was recorded")
    elif failed:
        gate.error(f"not written: gate(s) {', '.join(failed)} did not pass")
    if gate.status == ERROR or recorder is None:
        gate.summary = gate.problems[0]
        return gate
    path = store.record(recorder.shas, ctx.base.digest, merge=bool(ctx.options.only))
    conditions = sorted({at for _, at in recorder.shas})
    prompts_recorded = len({recorded.prompt_id for recorded, _ in recorder.shas})
    gate.status = PASSED
    gate.numbers.update(
        prompts=prompts_recorded,
        outputs=len(recorder.shas),
        conditions=conditions,
        file=str(path),
        server=store.key,
    )
    gate.summary = (
        f"{len(recorder.shas)} outputs of {prompts_recorded} prompts at "
        f"{', '.join(conditions)} in {path}"
    )
    return gate
