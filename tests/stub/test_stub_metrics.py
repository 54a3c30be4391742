"""Prometheus metrics: a real prefix cache, histograms, counters and gauges under load."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import requests
from stub_support import (
    HTTP_TIMEOUT,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    StartServer,
    metric,
    parse_prometheus,
    post,
)

from vmtests.stub import knobs, textgen

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


def long_prompt(topic: str) -> str:
    """A prompt of a few hundred tokens, different per ``topic`` from its first token on."""
    return " ".join(f"{topic} sentence {index} about durable serving flags." for index in range(40))


def test_repeated_prompt_hits_the_prefix_cache_and_a_fresh_one_does_not(
    start_server: StartServer,
) -> None:
    server = start_server(PRODUCTION_ARGS, PRODUCTION_ENV)
    prompt = long_prompt("alpha")
    tokens = len(textgen.tokenize(prompt))
    assert tokens > 128
    body = {"prompt": prompt, "max_tokens": 2}
    post(server.url, "/v1/completions", body).raise_for_status()
    assert metric(server.url, HITS) == 0
    assert metric(server.url, QUERIES) == tokens
    post(server.url, "/v1/completions", body).raise_for_status()
    # Full 64-token blocks before the last prompt token hit, as in vLLM.
    assert metric(server.url, HITS) == (tokens - 1) // 64 * 64
    post(server.url, "/v1/completions", {**body, "prompt": long_prompt("beta")}).raise_for_status()
    assert metric(server.url, HITS) == (tokens - 1) // 64 * 64


def test_metrics_parse_strictly_and_carry_vllm_names_and_labels(start_server: StartServer) -> None:
    server = start_server(PRODUCTION_ARGS, PRODUCTION_ENV)
    for _ in range(3):
        post(
            server.url, "/v1/completions", {"prompt": "count me", "max_tokens": 4}
        ).raise_for_status()
    response = requests.get(server.url + "/metrics", timeout=HTTP_TIMEOUT)
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse_prometheus(response.text)
    for name in (
        QUERIES, HITS, "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):  # fmt: skip
        assert name in samples, f"{name} missing"
        for labels, _ in samples[name]:
            assert labels["model_name"] == "qwen36"
            assert labels["engine"] == "0"
    assert sum(v for _, v in samples["vllm:request_success_total"]) == 3
    assert sum(v for _, v in samples["vllm:generation_tokens_total"]) == 12
    for histogram, observations in (
        ("vllm:time_to_first_token_seconds", 3),
        ("vllm:inter_token_latency_seconds", 9),
        ("vllm:e2e_request_latency_seconds", 3),
    ):
        buckets = [value for _, value in samples[f"{histogram}_bucket"]]
        assert buckets == sorted(buckets), f"{histogram} buckets are not cumulative"
        assert samples[f"{histogram}_bucket"][-1][0]["le"] == "+Inf"
        assert buckets[-1] == samples[f"{histogram}_count"][0][1] == observations
        assert samples[f"{histogram}_sum"][0][1] > 0


def test_64_concurrent_requests_queue_behind_max_num_seqs(start_server: StartServer) -> None:
    args = [*PRODUCTION_ARGS, "--max-num-seqs", "8"]
    # Slow enough that 64 requests pile up behind 8 slots even on a loaded machine.
    server = start_server(args, {**PRODUCTION_ENV, knobs.TIME_SCALE: "0.2"})
    peaks = {"running": 0.0, "waiting": 0.0}
    done = threading.Event()

    def watch() -> None:
        """Record the peak running and waiting gauges while the burst runs."""
        while not done.is_set():
            peaks["running"] = max(
                peaks["running"], metric(server.url, "vllm:num_requests_running")
            )
            peaks["waiting"] = max(
                peaks["waiting"], metric(server.url, "vllm:num_requests_waiting")
            )

    def one(index: int) -> int:
        """Send one request of the burst; return its HTTP status."""
        body = {"prompt": f"request {index} of the burst", "max_tokens": 8}
        response = post(server.url, "/v1/completions", body)
        assert response.json()["usage"]["completion_tokens"] == 8
        return response.status_code

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            statuses = list(pool.map(one, range(64)))
    finally:
        done.set()
        watcher.join(timeout=HTTP_TIMEOUT)
    assert statuses == [200] * 64
    assert metric(server.url, "vllm:request_success_total") == 64
    assert 0 < peaks["running"] <= 8
    assert peaks["waiting"] > 0
    assert metric(server.url, "vllm:num_requests_waiting") == 0
