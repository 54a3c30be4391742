"""Every endpoint of the stub through real HTTP (requests), streaming included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from stub_support import (
    BASELINE_ARGS,
    HTTP_TIMEOUT,
    MODEL,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    StartServer,
    base_env,
    post,
    sse_events,
)

from vmtests.guest.local_stub import LocalStubServer
from vmtests.stub import textgen

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalStubServer]:
    """One production-profile stub for the module (killed at its end, even on failure)."""
    with LocalStubServer(PRODUCTION_ARGS, base_env(**PRODUCTION_ENV)) as running:
        running.wait_ready(30)
        yield running


def test_health_is_200_with_an_empty_body(server: LocalStubServer) -> None:
    response = requests.get(server.url + "/health", timeout=HTTP_TIMEOUT)
    assert response.status_code == 200
    assert response.content == b""


def test_models_and_version(server: LocalStubServer) -> None:
    models = requests.get(server.url + "/v1/models", timeout=HTTP_TIMEOUT).json()
    assert models["object"] == "list"
    (entry,) = models["data"]
    assert (entry["id"], entry["object"], entry["owned_by"]) == (MODEL, "model", "vllm")
    assert entry["root"] == "/models/qwen36"
    assert entry["max_model_len"] > 0
    version = requests.get(server.url + "/version", timeout=HTTP_TIMEOUT).json()
    assert version["version"].startswith("0.")


def test_unknown_route_and_wrong_method(server: LocalStubServer) -> None:
    assert requests.get(server.url + "/v2/nothing", timeout=HTTP_TIMEOUT).status_code == 404
    assert post(server.url, "/health", {}).status_code == 405


def test_completion_is_deterministic_with_correct_usage(server: LocalStubServer) -> None:
    prompt = "Explain why the banner must survive a reboot, briefly."
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 7, "temperature": 0}
    first = post(server.url, "/v1/completions", body).json()
    second = post(server.url, "/v1/completions", body).json()
    assert first["object"] == "text_completion"
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert first["choices"][0]["finish_reason"] == "length"
    prompt_tokens = len(textgen.tokenize(prompt))
    assert first["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 7,
        "total_tokens": prompt_tokens + 7,
        "prompt_tokens_details": None,
    }
    assert len(textgen.tokenize(first["choices"][0]["text"])) == 7


def test_seed_changes_sampled_text_but_not_greedy_text(server: LocalStubServer) -> None:
    def text(seed: int, temperature: float) -> str:
        """The completion text for one seed and temperature."""
        body = {"prompt": "seeded", "max_tokens": 12, "seed": seed, "temperature": temperature}
        return str(post(server.url, "/v1/completions", body).json()["choices"][0]["text"])

    assert text(1, 0.7) != text(2, 0.7)
    assert text(1, 0.7) == text(1, 0.7)
    assert text(1, 0) == text(2, 0)


def test_streamed_completion_matches_the_plain_one(server: LocalStubServer) -> None:
    body = {"prompt": "stream me", "max_tokens": 5, "temperature": 0}
    plain = post(server.url, "/v1/completions", body).json()["choices"][0]["text"]
    response = post(server.url, "/v1/completions", {**body, "stream": True}, stream=True)
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == plain
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-1] == "length"
    assert len(chunks) == 5


def test_chat_plain_and_streamed_with_usage(server: LocalStubServer) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0}
    plain = post(server.url, "/v1/chat/completions", body).json()
    message = plain["choices"][0]["message"]
    assert plain["object"] == "chat.completion"
    assert message["role"] == "assistant"
    assert message["tool_calls"] == []
    assert plain["usage"]["completion_tokens"] == 6
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(post(server.url, "/v1/chat/completions", stream, stream=True))
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert content == message["content"]
    assert events[-2]["choices"] == []
    assert events[-2]["usage"] == plain["usage"]


def test_tool_calls_when_tools_are_given(server: LocalStubServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Weather in Berlin?"}],
        "tools": [WEATHER_TOOL],
    }
    reply = post(server.url, "/v1/chat/completions", body).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"city", "days"}
    assert isinstance(arguments["days"], int)
    events = sse_events(
        post(server.url, "/v1/chat/completions", {**body, "stream": True}, stream=True)
    )
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    streamed = "".join(
        d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d
    )
    assert streamed == call["function"]["arguments"]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_tool_choice_needs_tool_calling_enabled(start_server: StartServer) -> None:
    plain = start_server(BASELINE_ARGS)
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]}
    response = post(plain.url, "/v1/chat/completions", body)
    assert response.status_code == 400
    assert "--enable-auto-tool-choice" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "does not exist"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 40000}, 400, "maximum context length"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ],
)
def test_invalid_requests_get_vllm_errors(
    server: LocalStubServer, path: str, body: dict[str, object], status: int, message: str
) -> None:
    response = post(server.url, path, body)
    assert response.status_code == status
    reply: dict[str, Any] = response.json()
    assert list(reply) == ["error"]  # vLLM 0.16 ErrorResponse: {"error": {...}}
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert message in error["message"]
