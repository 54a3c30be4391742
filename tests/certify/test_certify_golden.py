"""The golden store: per condition, recorded only on request; missing values are errors, never
passes; a recording refuses an output that is not reproducible under its condition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmtests.certify.golden import (
    GoldenMissing,
    GoldenRecorder,
    GoldenStore,
    condition,
    golden_path,
    server_key,
)
from vmtests.certify.loadgen import RequestSpec

SPEC = RequestSpec("smoke-1", "Explain a prefix cache.", 48)
KEY = server_key("0.11.0", "qwen36", "/models/qwen36")
B1 = condition(1, warm=False)
B32_WARM = condition(32, warm=True)


def test_condition_keys() -> None:
    assert (B1, B32_WARM) == ("b1-cold", "b32-warm")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    with pytest.raises(GoldenMissing, match="--record-golden"):
        store.judge(SPEC, "0" * 64, B1)


def test_record_then_judge_per_condition(tmp_path: Path) -> None:
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    path = store.record({(SPEC, B1): "a" * 64, (SPEC, B32_WARM): "c" * 64}, "sha256:digest")
    assert path == golden_path("cfx-llm2", tmp_path)
    assert store.judge(SPEC, "a" * 64, B1).ok
    # Another batch size may legitimately give other tokens: each condition has its own value.
    assert store.judge(SPEC, "c" * 64, B32_WARM).ok
    verdict = store.judge(SPEC, "a" * 64, B32_WARM)
    assert not verdict.ok
    assert "differs from golden" in verdict.message
    assert "at b32-warm" in verdict.message
    with pytest.raises(GoldenMissing, match=r"no golden value at condition b8-cold \(recorded: "):
        store.judge(SPEC, "a" * 64, condition(8, warm=False))


def test_other_server_prompt_or_budget_is_missing(tmp_path: Path) -> None:
    GoldenStore("cfx-llm2", KEY, tmp_path).record({(SPEC, B1): "a" * 64}, "sha256:x")
    other = GoldenStore("cfx-llm2", server_key("0.16.0", "qwen36", "/models/qwen36"), tmp_path)
    with pytest.raises(GoldenMissing, match="no golden values for this server"):
        other.judge(SPEC, "a" * 64, B1)
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    with pytest.raises(GoldenMissing, match="no golden value for prompt"):
        store.judge(RequestSpec("smoke-2", "x", 48), "a" * 64, B1)
    with pytest.raises(GoldenMissing, match="changed since"):
        store.judge(RequestSpec("smoke-1", "another text", 48), "a" * 64, B1)
    with pytest.raises(GoldenMissing, match="max_tokens"):
        store.judge(RequestSpec("smoke-1", SPEC.prompt, 12), "a" * 64, B1)


def test_recording_keeps_other_servers_and_merges_a_partial_one(tmp_path: Path) -> None:
    GoldenStore("p", KEY, tmp_path).record({(SPEC, B1): "a" * 64}, "sha256:x")
    GoldenStore("p", "other", tmp_path).record({(SPEC, B1): "b" * 64}, "sha256:y")
    servers = json.loads(golden_path("p", tmp_path).read_text())["servers"]
    assert set(servers) == {KEY, "other"}
    second = RequestSpec("smoke-2", "Write a function.", 48)
    store = GoldenStore("p", KEY, tmp_path)
    store.record({(second, B1): "d" * 64}, "sha256:x", merge=True)
    assert store.judge(SPEC, "a" * 64, B1).ok
    assert store.judge(second, "d" * 64, B1).ok
    store.record({(second, B1): "d" * 64}, "sha256:x")  # a full recording replaces the entry
    with pytest.raises(GoldenMissing, match="no golden value for prompt smoke-1"):
        store.judge(SPEC, "a" * 64, B1)


def test_the_recorder_refuses_an_output_that_is_not_reproducible() -> None:
    recorder = GoldenRecorder()
    assert recorder.add(SPEC, B32_WARM, "a" * 64) == ""
    assert recorder.add(SPEC, B32_WARM, "a" * 64) == ""
    assert recorder.add(SPEC, B1, "b" * 64) == ""  # another condition: its own value
    problem = recorder.add(SPEC, B32_WARM, "c" * 64)
    assert problem.startswith("not reproducible at b32-warm")
    assert recorder.shas == {(SPEC, B32_WARM): "a" * 64, (SPEC, B1): "b" * 64}


def test_repository_golden_covers_every_judged_condition() -> None:
    """The golden file recorded on the reference guest (stub server) holds every prompt under
    the conditions the gates send it with the default options (hand-written here from the
    gates: B=1 for smoke, extended and decode; waves of 32, the first cold; the A/B's 8 after
    each switch; the long prompts two at a time, cold after the restart, then warm). A changed
    prompt or budget is caught here, not in a VM run."""
    from vmtests.certify import prompts  # noqa: PLC0415
    from vmtests.certify.context import Options, spec  # noqa: PLC0415
    from vmtests.stub.release import VLLM_VERSION  # noqa: PLC0415

    options = Options()
    cold, warm = "cold", "warm"
    expected: list[tuple[RequestSpec, set[str]]] = [
        *((spec(p, options.correctness_tokens), {f"b1-{cold}"}) for p in prompts.SMOKE),
        *((spec(p, options.correctness_tokens), {f"b1-{cold}"}) for p in prompts.EXTENDED),
        *(
            (spec(p, options.concurrency_tokens), {f"b32-{cold}", f"b32-{warm}"})
            for p in prompts.concurrency_prompts()
        ),
        *((spec(p, options.ab_tokens, options.seed), {f"b8-{cold}"}) for p in prompts.ab_prompts()),
        (spec(prompts.DECODE, options.decode_tokens), {f"b1-{cold}", f"b1-{warm}"}),
        *(
            (spec(p, options.long_tokens), {f"b2-{cold}", f"b2-{warm}"})
            for group in prompts.long_prompts().values()
            for p in group
        ),
    ]
    # Recorded for the release the stub claims: a new release needs --record-golden again.
    store = GoldenStore("cfx-llm2", server_key(VLLM_VERSION, "qwen36", "/models/qwen36"))
    assert len(store.outputs()) == len(expected) == 71
    for request, conditions in expected:
        for at in sorted(conditions):
            store.judge(request, "0" * 64, at)  # raises GoldenMissing on a missing entry
