"""The golden store: recorded only on request; missing values are errors, never passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmtests.certify.golden import GoldenMissing, GoldenStore, golden_path, server_key
from vmtests.certify.loadgen import RequestSpec

SPEC = RequestSpec("smoke-1", "Explain a prefix cache.", 48)
KEY = server_key("0.11.0", "qwen36", "/models/qwen36")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    with pytest.raises(GoldenMissing, match="--record-golden"):
        store.judge(SPEC, "0" * 64)


def test_record_then_judge(tmp_path: Path) -> None:
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    path = store.record({SPEC: "a" * 64}, "sha256:digest")
    assert path == golden_path("cfx-llm2", tmp_path)
    assert store.judge(SPEC, "a" * 64).ok
    verdict = store.judge(SPEC, "b" * 64)
    assert not verdict.ok
    assert "differs from golden" in verdict.message


def test_other_server_prompt_or_budget_is_missing(tmp_path: Path) -> None:
    GoldenStore("cfx-llm2", KEY, tmp_path).record({SPEC: "a" * 64}, "sha256:x")
    other = GoldenStore("cfx-llm2", server_key("0.16.0", "qwen36", "/models/qwen36"), tmp_path)
    with pytest.raises(GoldenMissing, match="no golden values for this server"):
        other.judge(SPEC, "a" * 64)
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    with pytest.raises(GoldenMissing, match="no golden value for prompt"):
        store.judge(RequestSpec("smoke-2", "x", 48), "a" * 64)
    with pytest.raises(GoldenMissing, match="changed since"):
        store.judge(RequestSpec("smoke-1", "another text", 48), "a" * 64)
    with pytest.raises(GoldenMissing, match="max_tokens"):
        store.judge(RequestSpec("smoke-1", SPEC.prompt, 12), "a" * 64)


def test_recording_keeps_other_servers(tmp_path: Path) -> None:
    GoldenStore("p", KEY, tmp_path).record({SPEC: "a" * 64}, "sha256:x")
    GoldenStore("p", "other", tmp_path).record({SPEC: "b" * 64}, "sha256:y")
    servers = json.loads(golden_path("p", tmp_path).read_text())["servers"]
    assert set(servers) == {KEY, "other"}


def test_repository_golden_covers_every_judged_prompt() -> None:
    # The golden file recorded on the reference guest (stub server) must match the frozen
    # prompt sets: a changed prompt or budget is caught here, not in a VM run.
    from vmtests.certify.context import Options  # noqa: PLC0415
    from vmtests.certify.run import golden_specs  # noqa: PLC0415
    from vmtests.stub.release import VLLM_VERSION  # noqa: PLC0415

    # Recorded for the release the stub claims: a new release needs --record-golden again.
    key = server_key(VLLM_VERSION, "qwen36", "/models/qwen36")
    store = GoldenStore("cfx-llm2", key)
    specs = golden_specs(Options())
    assert len(specs) == len(store.outputs()) == 71
    for spec in specs:
        store.judge(spec, "0" * 64)  # raises GoldenMissing on a missing or changed entry
