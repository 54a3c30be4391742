"""The OpenAI-compatible request and response bodies of vLLM's completions endpoints.

Pure functions: ``prepare`` turns a JSON body into a ``Prepared`` request (prompt, tokens to
emit, tool call), and the ``*_response`` / ``*_chunk`` helpers build vLLM-shaped bodies. Shapes
follow vLLM 0.16 ``entrypoints/openai/protocol.py``: ``ErrorResponse`` is ``{"error":
{message, type, param, code}}``; ``ModelCard`` carries a ``permission`` list of
``ModelPermission``; ``finish_reason`` is ``stop`` (a ``stop`` string or EOS, with
``stop_reason`` naming the string), ``length`` or ``tool_calls``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from vmtests.stub import textgen
from vmtests.stub.engine import RequestError
from vmtests.stub.faults import Faults

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 64  # vLLM fills the context; the stub caps the default (see docs)
AUTO_TOOL_CHOICE_ERROR = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
_ARGUMENT_PIECE = re.compile(r"\w+|\W")


@dataclass
class Prepared:
    """A validated request: what to feed the engine and how to answer."""

    chat: bool
    stream: bool
    include_usage: bool
    prompt_text: str
    prompt_ids: list[int]
    max_tokens: int
    pieces: list[str]
    tool_call: dict[str, Any] | None = None
    stop_reason: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def _bad_request(message: str) -> RequestError:
    return RequestError(400, "BadRequestError", message)


def _number(body: dict[str, Any], key: str, default: float, kind: type) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_request(f"{key}: Input should be a valid {kind.__name__}")
    return kind(value)


def check_model(body: dict[str, Any], served_name: str) -> None:
    """Reject a request naming another model, with vLLM's 404."""
    model = body.get("model")
    if model is not None and model != served_name:
        raise RequestError(404, "NotFoundError", f"The model `{model}` does not exist.")


def prepare(
    body: dict[str, Any], chat: bool, tool_calling: bool, faults: Faults, max_model_len: int
) -> Prepared:
    """Validate a completions (``chat=False``) or chat completions body."""
    tools: list[dict[str, Any]] | None = body.get("tools") if chat else None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad_request("messages: Field required")
        prompt_text = textgen.render_chat(messages, tools)
        prompt_ids = textgen.prompt_token_ids(prompt_text)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(item, int) for item in prompt) and prompt:
            prompt_text = " ".join(str(item) for item in prompt)
        elif isinstance(prompt, str) and prompt:
            prompt_text = prompt
        else:
            raise _bad_request("prompt: a non-empty string or list of token ids is required")
        prompt_ids = textgen.prompt_token_ids(prompt)
    default_max = COMPLETIONS_DEFAULT_MAX_TOKENS
    if chat:
        default_max = min(CHAT_DEFAULT_MAX_TOKENS, max(1, max_model_len - len(prompt_ids)))
        default_max = _number(body, "max_completion_tokens", default_max, int)
    max_tokens = _number(body, "max_tokens", default_max, int)
    if max_tokens < 1:
        raise _bad_request(f"max_tokens must be at least 1, got {max_tokens}.")
    temperature = _number(body, "temperature", 1.0, float)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad_request("seed: Input should be a valid integer")
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    prepared = Prepared(
        chat=chat,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)) if stream else True,
        prompt_text=prompt_text,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        pieces=textgen.generate(
            prompt_text,
            max_tokens,
            seed=seed,
            temperature=temperature,
            salt=faults.output_salt,
            degenerate=faults.degenerate,
        ),
    )
    if tools:
        _attach_tool_call(prepared, tools, body.get("tool_choice", "auto"), tool_calling, faults)
    if prepared.tool_call is None:
        _apply_stop(prepared, body.get("stop"))
    return prepared


def _apply_stop(prepared: Prepared, stop: Any) -> None:
    """Cut the output before the first ``stop`` string, as vLLM's detokenizer does."""
    if stop is None:
        return
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(item, str) for item in stops):
        raise _bad_request("stop: Input should be a valid string or list of strings")
    text = ""
    for index, piece in enumerate(prepared.pieces):
        text += piece
        hits = [(text.find(item), item) for item in stops if item and item in text]
        if hits:
            position, item = min(hits)
            kept = text[:position]
            previous = "".join(prepared.pieces[:index])
            prepared.pieces = [*prepared.pieces[:index], kept[len(previous) :]]
            prepared.pieces = [p for p in prepared.pieces if p] or [""]
            prepared.stop_reason = item
            return


def _attach_tool_call(
    prepared: Prepared, tools: list[dict[str, Any]], choice: Any, enabled: bool, faults: Faults
) -> None:
    if choice == "auto" and not enabled:
        raise _bad_request(AUTO_TOOL_CHOICE_ERROR)
    function = textgen.choose_tool(tools, choice)
    if function is None:
        if isinstance(choice, dict):
            raise _bad_request("tool_choice names a function that is not in tools")
        return
    call = textgen.tool_call(function, prepared.prompt_text, faults.output_salt)
    prepared.tool_call = call
    # The arguments are emitted whole (never cut at max_tokens) so they stay valid JSON.
    prepared.pieces = _ARGUMENT_PIECE.findall(call["function"]["arguments"])


def finish_reason(prepared: Prepared) -> str:
    """Why generation stopped, as the API reports it: a tool call, a stop string, the budget."""
    if prepared.tool_call is not None:
        return "tool_calls"
    return "stop" if prepared.stop_reason is not None else "length"


def engine_finish_reason(prepared: Prepared) -> str:
    """Why generation stopped, as the engine counts it (a finished tool call is a ``stop``)."""
    return "length" if finish_reason(prepared) == "length" else "stop"


def usage(prepared: Prepared, completion_tokens: int) -> dict[str, Any]:
    """The ``usage`` object: token counts of prompt and completion."""
    prompt = len(prepared.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def _envelope(prepared: Prepared, model: str, streaming: bool) -> dict[str, Any]:
    if prepared.chat:
        kind = "chat.completion.chunk" if streaming else "chat.completion"
        prefix = "chatcmpl-"
    else:
        kind, prefix = "text_completion", "cmpl-"
    return {
        "id": prefix + prepared.request_id,
        "object": kind,
        "created": prepared.created,
        "model": model,
    }


def full_response(prepared: Prepared, model: str, text: str, tokens: int) -> dict[str, Any]:
    """The non-streaming response body."""
    body = _envelope(prepared, model, streaming=False)
    reason = finish_reason(prepared)
    if prepared.chat:
        message: dict[str, Any] = {"role": "assistant", "reasoning_content": None}
        if prepared.tool_call is not None:
            message.update(content=None, tool_calls=[prepared.tool_call])
        else:
            message.update(content=text, tool_calls=[])
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "prompt_logprobs": None}
    choice.update(finish_reason=reason, stop_reason=prepared.stop_reason)
    body["choices"] = [choice]
    body["usage"] = usage(prepared, tokens)
    return body


def chunk(prepared: Prepared, model: str, delta: Any, finished: bool) -> dict[str, Any]:
    """One SSE chunk; ``delta`` is a text piece (completions) or a delta object (chat)."""
    body = _envelope(prepared, model, streaming=True)
    reason = finish_reason(prepared) if finished else None
    if prepared.chat:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
    else:
        choice = {"index": 0, "text": delta, "logprobs": None}
    choice.update(finish_reason=reason, stop_reason=prepared.stop_reason if finished else None)
    body["choices"] = [choice]
    return body


def chat_delta(prepared: Prepared, piece: str, first: bool) -> dict[str, Any]:
    """The chat delta carrying ``piece`` (content, or tool-call arguments)."""
    if prepared.tool_call is None:
        return {"content": piece}
    call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
    if first:
        function = prepared.tool_call["function"]
        call = {
            "index": 0,
            "id": prepared.tool_call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": piece},
        }
    return {"tool_calls": [call]}


def usage_chunk(prepared: Prepared, model: str, tokens: int) -> dict[str, Any]:
    """The final chunk with ``usage`` (``stream_options.include_usage``)."""
    body = _envelope(prepared, model, streaming=True)
    body["choices"] = []
    body["usage"] = usage(prepared, tokens)
    return body


def error_body(error: RequestError) -> dict[str, Any]:
    """vLLM 0.16's ``ErrorResponse``: the OpenAI shape, one ``error`` object."""
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": None,
            "code": error.status,
        }
    }


def _permission(created: int) -> dict[str, Any]:
    """``ModelPermission`` with vLLM's defaults."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def models_body(model_name: str, model_path: str, max_model_len: int) -> dict[str, Any]:
    """The ``/v1/models`` body."""
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {
                "id": model_name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": model_path,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [_permission(created)],
            }
        ],
    }


def dumps(body: dict[str, Any]) -> bytes:
    """Compact JSON bytes, as FastAPI sends them."""
    return json.dumps(body, separators=(",", ":")).encode()
