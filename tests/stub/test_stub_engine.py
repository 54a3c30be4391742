"""The stub engine's timing, as vLLM's engine core reports it (vmtests.stub.engine)."""

from __future__ import annotations

import re
import time

import pytest

from vmtests.stub.engine import Engine, EngineRequest, RequestStats
from vmtests.stub.faults import Faults
from vmtests.stub.latency import LatencyModel

STEP_SECONDS = 0.01
CLIENT_PAUSE = 0.1
TOKENS = 6


def _histogram_sum(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}_sum\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, f"{name}_sum missing from:\n{text}"
    return float(match.group(1))


def test_inter_token_latency_is_the_engines_step_not_the_clients_pace() -> None:
    # The scale that makes one decode step of one running sequence take STEP_SECONDS.
    unscaled = LatencyModel(scale=1.0, decode_factor=1.0, prefill_factor=0.0).step_seconds(1)
    latency = LatencyModel(scale=STEP_SECONDS / unscaled, decode_factor=1.0, prefill_factor=0.0)
    engine = Engine(
        model_name="qwen36",
        max_num_seqs=1,
        max_model_len=4096,
        latency=latency,
        faults=Faults(),
        prefix_cache=None,
    )
    request = EngineRequest(prompt_ids=[1, 2, 3], pieces=[f"t{i}" for i in range(TOKENS)])
    for _ in engine.run(request, RequestStats()):
        time.sleep(CLIENT_PAUSE)  # the API server streaming the token to a slow client
    itl_sum = _histogram_sum(engine.metrics.render(), "vllm:inter_token_latency_seconds")
    # The card's modelled steps; the client's pauses (0.5 s in all) are not the engine's.
    assert itl_sum == pytest.approx((TOKENS - 1) * STEP_SECONDS)
