"""The vLLM command line the stub accepts, with the spellings of vLLM 0.16 (``release.py``).

Flags follow vLLM ``engine/arg_utils.py`` and ``entrypoints/openai/cli_args.py``. Unknown or
invalid arguments end the process the way vLLM's argparse does: usage and an ``error:`` line on
stderr, exit status 2. Only flags the serving module can plausibly pass are known; anything else
is an error on purpose, so a misspelt flag fails in a VM as on hardware. ``--tool-call-parser``
is a free string, as in vLLM: an unregistered name fails later, at server setup
(``server.py``), with vLLM's own error.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from typing import Any

from vmtests.stub.release import REASONING_PARSERS

DEFAULT_MODEL = "Qwen/Qwen3.6-35B-A3B"
MAMBA_CACHE_MODES = ("all", "align", "none")  # vLLM config/cache.py MambaCacheMode


def _max_model_len(text: str) -> int:
    """vLLM accepts ``32768``, ``32k`` or ``32K``; mirror that."""
    multiplier = 1
    if text[-1:] in {"k", "K"}:
        multiplier, text = 1024 if text[-1] == "K" else 1000, text[:-1]
    return int(text) * multiplier


def loads(text: str) -> dict[str, Any]:
    """Parse ``--additional-config``; named ``loads`` so argparse says ``invalid loads value``."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError("--additional-config must be a JSON object")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


_positive_int.__name__ = "int"
_max_model_len.__name__ = "human_readable_int"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``vllm serve`` restricted to the flags the module may pass."""
    parser = argparse.ArgumentParser(
        prog="vllm serve",
        description="Stub of the vLLM OpenAI-compatible API server (vmtests).",
        allow_abbrev=False,
    )
    parser.add_argument("model_tag", nargs="?", default=None, help="the model tag to serve")
    parser.add_argument("--model", default=None)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=_positive_int, default=8000)
    parser.add_argument("--block-size", type=_positive_int, default=None)
    parser.add_argument("--max-model-len", type=_max_model_len, default=None)
    parser.add_argument("--max-num-seqs", type=_positive_int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None
    )
    parser.add_argument("--mamba-cache-mode", choices=MAMBA_CACHE_MODES, default="none")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--enable-auto-tool-choice", action="store_true", default=False)
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument("--reasoning-parser", choices=REASONING_PARSERS, default=None)
    parser.add_argument("--additional-config", type=loads, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--trust-remote-code", action="store_true", default=False)
    parser.add_argument("--disable-log-stats", action="store_true", default=False)
    parser.add_argument("--disable-log-requests", action="store_true", default=False)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    # FrontendArgs.api_key: list[str] | None (vLLM 0.16 entrypoints/openai/cli_args.py): one or
    # more keys; each is accepted, and the option wins over $VLLM_API_KEY.
    parser.add_argument("--api-key", nargs="+", default=None)
    return parser


@dataclass(frozen=True)
class ServeArgs:
    """The parsed command line, with vLLM's defaults applied."""

    model_tag: str | None
    model: str | None
    served_model_name: list[str] | None
    host: str | None
    port: int
    block_size: int | None
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enable_prefix_caching: bool | None
    mamba_cache_mode: str
    async_scheduling: bool | None
    enable_auto_tool_choice: bool
    tool_call_parser: str | None
    reasoning_parser: str | None
    additional_config: dict[str, Any] | None
    tensor_parallel_size: int
    seed: int | None
    dtype: str
    trust_remote_code: bool
    disable_log_stats: bool
    disable_log_requests: bool
    gpu_memory_utilization: float
    api_key: list[str] | None

    @property
    def model_path(self) -> str:
        """The model being served: the positional tag wins over ``--model``, as in vLLM."""
        return self.model_tag or self.model or DEFAULT_MODEL

    @property
    def model_name(self) -> str:
        """The first served model name (what ``/v1/models`` lists and metrics label)."""
        return self.served_model_name[0] if self.served_model_name else self.model_path

    @property
    def effective_block_size(self) -> int:
        """The KV block size; qwen36 on the TT plugin uses 64 when not given."""
        return self.block_size or 64

    @property
    def effective_max_model_len(self) -> int:
        """The context length; the stub's stand-in for the model config's default."""
        return self.max_model_len or 32768

    @property
    def effective_max_num_seqs(self) -> int:
        """The concurrency cap (vLLM's default for an API server is 256)."""
        return self.max_num_seqs or 256

    def non_default(self, parser: argparse.ArgumentParser) -> dict[str, Any]:
        """The ``non-default args`` dict vLLM logs at startup: every value not at its default."""
        result: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value != parser.get_default(field.name):
                result[field.name] = value
        return result


def parse_args(argv: list[str]) -> tuple[ServeArgs, argparse.ArgumentParser]:
    """Parse ``argv``; exit 2 with an argparse error on unknown or invalid arguments.

    Combinations vLLM rejects after parsing (``--enable-auto-tool-choice`` without a parser)
    are ``server.py``'s job, as in vLLM.
    """
    parser = build_parser()
    namespace = parser.parse_args(argv)
    args = ServeArgs(**vars(namespace))
    return args, parser
