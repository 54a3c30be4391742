"""Deterministic "model": tokenization, chat template, generated text and tool calls.

The output depends only on the prompt, the sampling seed (when sampling) and the fault salt,
so a correctness gate can compare output shas across runs, arms and reboots. Greedy requests
(``temperature == 0``) ignore the seed, as greedy decoding does.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from vmtests.stub.faults import DEGENERATE_PREFIX, DEGENERATE_TOKEN

_TOKEN = re.compile(r"\w+|[^\w\s]")
VOCABULARY = (
    "the", "card", "streams", "tokens", "through", "a", "resident", "decode", "chain", "while",
    "prefix", "blocks", "stay", "cached", "on", "device", "and", "every", "banner", "survives",
    "reboot", "because", "module", "declares", "it", "so", "switch", "keeps", "flags", "durable",
    "kernel", "boots", "with", "hugepages", "ready", "before", "serving", "starts", "again",
    "model", "answers", "quickly", "under", "load", "when", "eight", "requests", "share", "one",
    "batch", "guard", "merges", "safely", "into", "attention", "tiles", "of", "mamba", "state",
    "aligned", "to", "sixty", "four",
)  # fmt: skip


def tokenize(text: str) -> list[str]:
    """Split text into word and punctuation tokens (whitespace is not a token): the one
    tokenization of the suite (the stub's model, the certification's degenerate-output detector
    and prompt-size estimates)."""
    return _TOKEN.findall(text)


def token_id(token: str) -> int:
    """A stable integer id for a token (what the prefix cache hashes)."""
    return int.from_bytes(hashlib.sha256(token.encode()).digest()[:4], "big")


def prompt_token_ids(prompt: str | list[int]) -> list[int]:
    """Token ids of a text prompt, or the ids themselves when the prompt is already ids."""
    if isinstance(prompt, list):
        return list(prompt)
    return [token_id(token) for token in tokenize(prompt)]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content, sort_keys=True)


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """Render chat messages with a Qwen-style template into the prompt text."""
    parts: list[str] = []
    if tools:
        parts.append("<|im_start|>system\n# Tools\n" + json.dumps(tools, sort_keys=True))
        parts.append("<|im_end|>\n")
    for message in messages:
        role = str(message.get("role", "user"))
        parts.append(f"<|im_start|>{role}\n{_content_text(message.get('content'))}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _stream_key(prompt: str, seed: int | None, temperature: float, salt: str) -> bytes:
    sampling = "greedy" if temperature == 0 else f"seed={seed or 0}"
    return f"{prompt}\0{sampling}\0{salt}".encode()


def generate(
    prompt: str,
    max_tokens: int,
    *,
    seed: int | None = None,
    temperature: float = 1.0,
    salt: str = "",
    degenerate: bool = False,
) -> list[str]:
    """The generated tokens; joining them gives the completion text (one piece per token)."""
    if degenerate:
        pieces = [*DEGENERATE_PREFIX, *[DEGENERATE_TOKEN] * max(0, max_tokens - 2)]
        return pieces[:max_tokens]
    key = _stream_key(prompt, seed, temperature, salt)
    pieces = []
    for index in range(max_tokens):
        digest = hashlib.sha256(key + index.to_bytes(4, "big")).digest()
        pieces.append(" " + VOCABULARY[int.from_bytes(digest[:4], "big") % len(VOCABULARY)])
    return pieces


def _argument_value(schema: dict[str, Any], seed: bytes) -> Any:
    kind = schema.get("type", "string")
    number = int.from_bytes(hashlib.sha256(seed).digest()[:2], "big")
    if schema.get("enum"):
        return schema["enum"][number % len(schema["enum"])]
    if kind in {"integer", "number"}:
        return number % 100
    if kind == "boolean":
        return number % 2 == 0
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return VOCABULARY[number % len(VOCABULARY)]


def choose_tool(tools: list[dict[str, Any]], tool_choice: Any) -> dict[str, Any] | None:
    """The function to call: the named one for a named ``tool_choice``, else the first."""
    functions = [tool.get("function", {}) for tool in tools if tool.get("type") == "function"]
    if not functions or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        wanted = tool_choice.get("function", {}).get("name")
        for function in functions:
            if function.get("name") == wanted:
                return dict(function)
        return None
    return dict(functions[0])


def tool_call(function: dict[str, Any], prompt: str, salt: str = "") -> dict[str, Any]:
    """An OpenAI ``tool_calls`` item calling ``function`` with arguments drawn from the prompt."""
    properties = function.get("parameters", {}).get("properties", {})
    arguments = {
        name: _argument_value(
            schema if isinstance(schema, dict) else {}, (prompt + salt + name).encode()
        )
        for name, schema in sorted(properties.items())
    }
    call_id = hashlib.sha256((prompt + salt).encode()).hexdigest()[:24]
    return {
        "id": f"chatcmpl-tool-{call_id}",
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": json.dumps(arguments)},
    }
