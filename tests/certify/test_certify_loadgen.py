"""The load generator against a real local stub server (no VM)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from certify_support import running_stub

from vmtests.certify import degenerate
from vmtests.certify.loadgen import (
    CONNECTION,
    TIMEOUT,
    LoadGenerator,
    RequestSpec,
    overhead_summary,
    run_batch,
    sha256_text,
)
from vmtests.guest.local_stub import LocalStubServer
from vmtests.stub import knobs, textgen

ARGS = ["--model", "/models/qwen36", "--served-model-name", "qwen36", "--max-num-seqs", "8"]
TIME_SCALE = "0.02"


@pytest.fixture
def server() -> Iterator[LocalStubServer]:
    with running_stub(ARGS, TIME_SCALE) as stub:
        yield stub


def test_records_ttft_decode_step_and_sha(server: LocalStubServer) -> None:
    generator = LoadGenerator(server.url, model="qwen36", timeout=30)
    spec = RequestSpec("p", "Explain a prefix cache.", 20)
    record = generator.send(spec, "smoke", "A", 0)
    assert record.ok, record
    assert record.status == 200
    assert record.chunks == 20
    # The greedy text is the stub's deterministic generation for the chat-templated prompt.
    prompt = textgen.render_chat([{"role": "user", "content": spec.prompt}], None)
    expected = "".join(textgen.generate(prompt, 20, temperature=0.0))
    assert record.output_sha == sha256_text(expected)
    assert record.ttft is not None
    assert record.e2e is not None
    assert 0 < record.ttft < record.e2e
    # Decode step: 48.6 ms x 0.02 = 0.97 ms per token in the model; sleeps only overshoot.
    assert record.decode_step is not None
    assert record.decode_step >= 0.9e-3
    assert record.prompt_tokens is not None
    assert record.prompt_tokens > 5


def test_ttft_skips_the_role_only_chunk() -> None:
    # With a long modelled prefill, the role chunk would arrive at once if it counted; the
    # first content chunk comes only after prefill (20 ms fixed + 4 ms/token, x scale 1.0).
    with running_stub(ARGS, "1.0") as stub:
        record = LoadGenerator(stub.url).send(RequestSpec("p", "word " * 50, 2), "t", "A", 0)
    assert record.ok, record
    assert record.ttft is not None
    assert record.ttft >= 0.2  # 20 + 4 x ~60 tokens = 0.26 s of modelled prefill


def test_errors_and_degenerate_output_are_recorded() -> None:
    with running_stub(ARGS, TIME_SCALE, **{knobs.FAIL_RATE: "1.0"}) as stub:
        record = LoadGenerator(stub.url).send(RequestSpec("p", "hello", 4), "t", "A", 0)
    assert record.status == 500
    assert "HTTP 500" in record.error
    assert record.error_kind == "http-500"
    assert not record.ok
    with running_stub(ARGS, TIME_SCALE, **{knobs.DEGENERATE: "1"}) as stub:
        record = LoadGenerator(stub.url).send(RequestSpec("p", "hello", 24), "t", "A", 0)
    assert record.text.startswith("HT#3333")
    assert degenerate.inspect(record.text)


def test_unreachable_endpoint_is_a_failed_record() -> None:
    record = LoadGenerator("http://127.0.0.1:9", timeout=5).send(
        RequestSpec("p", "x", 2), "t", "A", 0
    )
    assert not record.ok
    assert "ConnectionRefusedError" in record.error
    assert record.error_kind == CONNECTION


def test_a_request_that_never_answers_is_a_timeout() -> None:
    with running_stub(ARGS, TIME_SCALE, **{knobs.HANG: "request"}) as stub:
        record = LoadGenerator(stub.url, timeout=2).send(RequestSpec("p", "x", 2), "t", "A", 0)
    assert not record.ok
    assert record.error_kind == TIMEOUT, record.error


def test_batch_concurrency_and_overhead(server: LocalStubServer) -> None:
    generator = LoadGenerator(server.url, timeout=30)
    specs = [RequestSpec(f"p{i}", f"Prompt number {i} about caches.", 8) for i in range(24)]
    batch = run_batch(generator, specs, concurrency=8, stage="conc", label="wave")
    assert [r.index for r in batch.records] == list(range(24))
    assert all(r.ok for r in batch.records), [r.error for r in batch.records if not r.ok]
    # 24 requests at 8 wide take at least three rounds of 8 tokens of modelled decode.
    assert batch.makespan >= 3 * 7 * 48.6 * 0.02 / 1000
    overhead = overhead_summary(batch.records)
    assert overhead["requests"] == 24
    assert overhead["client_cpu_mean_ms"] > 0
    with pytest.raises(ValueError, match="http://host:port"):
        LoadGenerator("ftp://x")


def test_overhead_benchmark_reports_figures() -> None:
    from vmtests.certify.bench import measure  # noqa: PLC0415

    figures = measure(requests=16, concurrency=4, tokens=4)
    assert figures["failed"] == 0
    assert figures["requests"] == 16
    assert figures["requests_per_s"] > 0
    assert 0 < figures["client_cpu_share_of_e2e"] <= 1.5
