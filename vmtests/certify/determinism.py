"""The determinism probe: report-only, the first thing to run on a new host.

vLLM gives reproducible online output only with batch invariance (vLLM docs,
``docs/usage/reproducibility.md``), which a Tenstorrent card does not have
(``docs/features/batch_invariance.md`` lists NVIDIA, AMD and Intel kernels only). A correct
server may then give other tokens at another batch size, and golden values recorded at one
batch size would call it wrong. The probe sends the five smoke prompts at temperature 0

- at B=1 three times (the first cold, then warm twice),
- together with fillers at B=8 twice and at B=32 twice (warm),

and compares each prompt's outputs: across repeats at one batch size (is it deterministic at
all?), cold against warm (does the prefix cache change it?), and each batch size against B=1
warm (is it batch-invariant?). For every difference it says where the texts part and how they
go on. A degenerate or failed response is wrong whatever the batch size. Nothing is judged
against golden values and nothing fails: the gate's status is ``reported``.
"""

from __future__ import annotations

from vmtests.certify import prompts
from vmtests.certify.context import Context, spec
from vmtests.certify.gates_perf import QUERY_COUNTER, counter_total
from vmtests.certify.loadgen import RequestRecord
from vmtests.certify.model import REPORTED, GateResult

B1_SENDS = 3
BATCHES = (8, 32)
REPEATS = 2
EXCERPT = 40
COMPARISONS = (
    ("cold vs warm at B=1", "b1 send 1", "b1 send 2"),
    ("repeat at B=1", "b1 send 2", "b1 send 3"),
    *((f"B={b} vs B=1", f"b{b} send 1", "b1 send 2") for b in BATCHES),
    *((f"repeat at B={b}", f"b{b} send 1", f"b{b} send 2") for b in BATCHES),
)


def divergence(first: str, second: str) -> dict[str, object]:
    """Where two texts part: the length of their common prefix and an excerpt of each from
    a little before that point."""
    common = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        common += 1
    start = max(0, common - 10)
    return {
        "common_prefix_chars": common,
        "first": first[start : common + EXCERPT],
        "second": second[start : common + EXCERPT],
    }


def probe_verdict(differing: list[str], wrong: list[str]) -> str:
    """One prompt's verdict from the comparisons that differ and its wrong responses."""
    if wrong:
        return "wrong: " + "; ".join(wrong)
    if not differing:
        return "identical across batch sizes, cache state and repeats"
    kinds = []
    if any(name.startswith("repeat") for name in differing):
        kinds.append("not deterministic (differs between repeats)")
    if any(name.startswith("cold") for name in differing):
        kinds.append("depends on the cache state")
    if any(name.startswith("B=") for name in differing):
        kinds.append("not batch-invariant (differs across batch sizes)")
    return "; ".join(kinds)


def probe(ctx: Context) -> GateResult:
    """Send the probe's batches and report, per prompt, what differs and how."""
    gate = GateResult("determinism")
    tokens = ctx.options.correctness_tokens
    probes = [spec(prompt, tokens) for prompt in prompts.SMOKE]
    fillers = [spec(prompt, tokens) for prompt in prompts.concurrency_prompts()]
    status, metrics = ctx.generator.get("/metrics")
    queries = counter_total(metrics, QUERY_COUNTER) if status == 200 else None
    sends: dict[str, dict[str, RequestRecord]] = {}
    for number in range(1, B1_SENDS + 1):
        batch = ctx.batch(probes, concurrency=1, stage="determinism", label=f"b1-{number}")
        sends[f"b1 send {number}"] = {r.prompt_id: r for r in batch.records}
    for width in BATCHES:
        together = probes + fillers[: width - len(probes)]
        for number in range(1, REPEATS + 1):
            label = f"b{width}-{number}"
            batch = ctx.batch(together, concurrency=width, stage="determinism", label=label)
            sends[f"b{width} send {number}"] = {r.prompt_id: r for r in batch.records}
    results: dict[str, dict[str, object]] = {}
    counts: dict[str, int] = {}
    for prompt in probes:
        wrong = sorted(
            {
                f"{name}: {record.error or '; '.join(record.findings) or 'empty'}"
                for name, records in sends.items()
                if not (record := records[prompt.prompt_id]).ok
            }
        )
        compared: dict[str, object] = {}
        for name, left, right in COMPARISONS:
            first, second = sends[left][prompt.prompt_id], sends[right][prompt.prompt_id]
            if first.output_sha != second.output_sha:
                compared[name] = divergence(first.text, second.text)
        verdict = probe_verdict(list(compared), wrong)
        counts[verdict] = counts.get(verdict, 0) + 1
        results[prompt.prompt_id] = {"verdict": verdict, "differences": compared}
    gate.numbers.update(
        prompts=len(probes),
        batches=[1, *BATCHES],
        prefix_cache_queries_before=queries,
        results=results,
        verdicts=counts,
    )
    gate.status = REPORTED
    gate.summary = "; ".join(
        f"{count} of {len(probes)}: {verdict}" for verdict, count in counts.items()
    )
    if queries:
        gate.summary += (
            f" (the server had answered {queries:.0f} prefix-cache queries before the probe: "
            "its first sends may not have been cold)"
        )
    return gate
