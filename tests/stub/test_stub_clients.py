"""What the stub serves stays readable by the clients people use with vLLM.

The ``openai`` Python client reads the completions, chat, streaming, model list and error
bodies; prometheus_client's own parser reads ``/metrics``, and prometheus_client's own writer,
fed the same families and labels as vLLM ``v1/metrics/loggers.py`` declares them, writes the
same sample names with the same label order. Both packages are dev extras.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import openai
import prometheus_client as prometheus
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from stub_support import HTTP_TIMEOUT, MODEL, PRODUCTION_ARGS, PRODUCTION_ENV, StartServer

from vmtests.guest.local_stub import LocalStubServer


@pytest.fixture
def server(start_server: StartServer) -> LocalStubServer:
    """The production configuration."""
    return start_server(PRODUCTION_ARGS, PRODUCTION_ENV)


def client(server: LocalStubServer) -> openai.OpenAI:
    """An OpenAI client pointed at the stub, without retries (a failure must show at once)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_reads_models_completions_and_chat(server: LocalStubServer) -> None:
    api = client(server)
    (model,) = api.models.list().data
    assert model.id == MODEL
    assert model.owned_by == "vllm"
    completion = api.completions.create(model=MODEL, prompt="durable flags", max_tokens=5)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    chat = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content


def test_openai_client_reads_streams_and_stop_reasons(server: LocalStubServer) -> None:
    api = client(server)
    plain = api.completions.create(model=MODEL, prompt="a b c", max_tokens=12, temperature=0)
    text = plain.choices[0].text
    word = text.split()[2]
    stopped = api.completions.create(
        model=MODEL, prompt="a b c", max_tokens=12, temperature=0, stop=[word]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert text.startswith(stopped.choices[0].text)
    assert word not in stopped.choices[0].text
    pieces = []
    reasons = []
    stream = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert "".join(pieces)
    assert reasons[-1] == "length"


def test_openai_client_raises_its_typed_errors(server: LocalStubServer) -> None:
    api = client(server)
    with pytest.raises(openai.NotFoundError) as missing:
        api.completions.create(model="other", prompt="x", max_tokens=1)
    assert "The model `other` does not exist." in str(missing.value)
    with pytest.raises(openai.BadRequestError) as too_long:
        api.completions.create(model=MODEL, prompt="x", max_tokens=10**6)
    assert "maximum context length" in str(too_long.value)


def test_prometheus_client_parses_metrics_and_the_cache_config(server: LocalStubServer) -> None:
    text = requests.get(server.url + "/metrics", timeout=HTTP_TIMEOUT).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["vllm:prompt_tokens"].type == "counter"
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1.0
    assert info.labels["enable_prefix_caching"] == "True"
    assert info.labels["mamba_cache_mode"] == "align"
    assert info.labels["block_size"] == "64"
    assert info.labels["engine"] == "0"
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}


def _shape(text: str) -> list[str]:
    """Every non-comment line with its value dropped and label values blanked."""
    shape = []
    for line in text.splitlines():
        if line.startswith("#"):
            shape.append(line.split(" ", 3)[1] + " " + line.split(" ", 3)[2])
            continue
        name, _, rest = line.partition("{")
        keys = [pair.split("=", 1)[0] for pair in rest.rsplit("}", 1)[0].split('",') if pair]
        shape.append(f"{name}{{{','.join(keys)}}}")
    return shape


def test_metrics_are_laid_out_as_prometheus_client_writes_them(
    server: LocalStubServer,
) -> None:
    """The same families, declared as vLLM declares them, written by prometheus_client."""
    stub_text = requests.get(server.url + "/metrics", timeout=HTTP_TIMEOUT).text
    parsed = {f.name: f for f in text_string_to_metric_families(stub_text)}
    registry = prometheus.CollectorRegistry()
    labelnames = ["model_name", "engine"]
    for family in parsed.values():
        documentation = family.documentation
        if family.name == "vllm:cache_config_info":
            # vLLM passes CacheConfig.metrics_info() keys, then "engine".
            (sample,) = family.samples
            assert "enable_prefix_caching" in sample.labels
            assert "engine" in sample.labels
            order = list(sample.labels)
            gauge = prometheus.Gauge(family.name, documentation, order, registry=registry)
            gauge.labels(**sample.labels).set(1)
        elif family.name == "vllm:request_success":
            counter = prometheus.Counter(
                family.name,
                documentation,
                labelnames=[*labelnames, "finished_reason"],
                registry=registry,
            )
            for reason in ("stop", "length", "abort", "error"):
                counter.labels(model_name=MODEL, engine="0", finished_reason=reason)
        elif family.type == "counter":
            kind = prometheus.Counter(family.name, documentation, labelnames, registry=registry)
            kind.labels(model_name=MODEL, engine="0")
        elif family.type == "gauge" and not family.name.endswith("_created"):
            prometheus.Gauge(family.name, documentation, labelnames, registry=registry).labels(
                model_name=MODEL, engine="0"
            )
        elif family.type == "histogram":
            buckets = sorted(
                float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")
            )
            histogram = prometheus.Histogram(
                family.name, documentation, labelnames, buckets=buckets, registry=registry
            )
            histogram.labels(model_name=MODEL, engine="0")
    reference = prometheus.generate_latest(registry).decode()
    assert _shape(stub_text) == _shape(reference)


def test_a_client_that_resets_its_connection_after_the_answer_is_no_error(
    server: LocalStubServer,
) -> None:
    """A load generator closes its connection once it has read ``[DONE]``, before the closing
    chunk: the server's keep-alive read of a next request is then reset. uvicorn logs nothing
    of it; the stub must not log a traceback (in a guest, its lines fill the journal)."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
         "stream": True}
    ).encode()  # fmt: skip
    for _ in range(3):
        with socket.create_connection((server.host, server.port), timeout=HTTP_TIMEOUT) as conn:
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: stub\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            seen = b""
            while b"[DONE]" not in seen:
                chunk = conn.recv(65536)
                assert chunk, seen
                seen += chunk
            # Close with a reset (SO_LINGER 0), as a close with unread data does.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert requests.get(server.url + "/health", timeout=HTTP_TIMEOUT).status_code == 200
    time.sleep(0.5)  # the resets reach the server's keep-alive reads
    output = server.output()
    assert output.count('"POST /v1/chat/completions HTTP/1.1" 200 OK') == 3, server.tail()
    assert "Traceback" not in output, server.tail()
    assert "ConnectionResetError" not in output, server.tail()
