"""The one vLLM release (and Tenstorrent plugin) the stub imitates, and the texts they print.

The release is vLLM 0.16.0: the first release that has every flag the serving module passes
(``--mamba-cache-mode`` appears in 0.16; ``--enable-prefix-caching``/``--no-...``,
``--async-scheduling``/``--no-...``, ``--enable-auto-tool-choice``, ``--tool-call-parser``,
``--block-size``, ``--max-model-len``, ``--max-num-seqs`` and ``--served-model-name`` are older).
Everything release-specific lives here so that a move to another release is one edit:

- version line: vLLM ``entrypoints/utils.py`` ``log_version_and_model`` (the logo with
  ``version``/``model`` lines under vLLM's own formatter, the plain ``vLLM server version %s,
  serving model %s`` when ``VLLM_DISABLE_LOG_LOGO`` is set);
- ``--model`` warning: vLLM ``utils/argparse_utils.py`` (``FlexibleArgumentParser``);
- mamba cache mode lines: vLLM ``model_executor/models/config.py``
  (``HybridAttentionMambaModelConfig.verify_and_update_config``);
- ``Asynchronous scheduling is enabled/disabled.``: vLLM ``config/vllm.py``;
- the async-decode warning and ``Automatic prefix caching is ...``: the Tenstorrent plugin's
  ``vllm_tt_plugin/platform.py`` (``TTPlatform.check_and_update_config``);
- tool-parser errors: vLLM ``entrypoints/openai/cli_args.py`` (``validate_parsed_serve_args``)
  and ``entrypoints/openai/api_server.py`` (``validate_api_server_args``);
- engine config line: vLLM ``v1/engine/core.py``; finish reasons: ``v1/engine/__init__.py``.

The version carries a PEP 440 local label so that every client still parses it while the
stub never passes for a real server: ``0.16.0+vmtests.stub``.
"""

from __future__ import annotations

VLLM_RELEASE = "0.16.0"
VLLM_VERSION = f"{VLLM_RELEASE}+vmtests.stub"

# Hugging Face architecture of Qwen3.6-35B-A3B, and the TT model class serving it. The plugin
# prepends "TT" to the architecture (vllm_tt_plugin/platform.py); the qwen36 model code is not
# public, so its module name is this repository's stand-in.
HF_ARCHITECTURE = "Qwen3_5MoeForConditionalGeneration"
TT_MODEL_CLASS = "Qwen36ForCausalLM"
TT_MODEL_MODULE = "models.demos.qwen36.tt.qwen36_vllm"
# Qwen3.5/3.6 do not support mamba prefix caching in mode "all", so vLLM picks "align".
SUPPORTS_MAMBA_PREFIX_CACHING = False

LOGO_DISABLE_VARIABLE = "VLLM_DISABLE_LOG_LOGO"

MODEL_OPTION_WARNING = (
    "With `vllm serve`, you should provide the model as a positional argument or in a config "
    "file instead of via the `--model` option. The `--model` option will be removed in a "
    "future version."
)

AUTO_TOOL_WITHOUT_PARSER = "Error: --enable-auto-tool-choice requires --tool-call-parser"
# Tool and reasoning parsers registered in vLLM 0.16 (a subset; the module uses qwen3_coder).
TOOL_CALL_PARSERS = (
    "deepseek_v3",
    "deepseek_v31",
    "glm45",
    "granite",
    "hermes",
    "internlm",
    "jamba",
    "kimi_k2",
    "llama3_json",
    "llama4_pythonic",
    "minimax_m2",
    "mistral",
    "openai",
    "pythonic",
    "qwen3_coder",
    "qwen3_xml",
)
REASONING_PARSERS = ("deepseek_r1", "glm45", "qwen3")

# v1/engine/__init__.py FINISH_REASON_STRINGS; /metrics has one request_success series each.
FINISH_REASONS = ("stop", "length", "abort", "error")

TOOL_CHOICE_LINE = '"auto" tool choice has been enabled.'

# Source locations printed in the log prefix, named after the real files that log each line.
ENGINE_FATAL = "EngineCore encountered a fatal error."
"""vLLM v1's engine core when it dies while serving (``vllm/v1/engine/core.py``,
``run_engine_core``)."""
SERVER_TERMINATING = "AsyncLLMEngine has failed, terminating server process"
"""The API server then (``vllm/entrypoints/launcher.py``, ``terminate_if_errored``)."""

SOURCES = {
    "model_option": "argparse_utils.py:260",
    "version": "utils.py:299",
    "args": "utils.py:233",
    "tool_args": "api_server.py:1890",
    "mamba": "config.py:367",
    "mamba_info": "config.py:387",
    "async": "vllm.py:840",
    "tt_async": "platform.py:412",
    "prefix": "platform.py:467",
    "banner": "qwen36_vllm.py:231",
    "refusal": "qwen36_vllm.py:242",
    "device": "device.py:57",
    "engine": "core.py:93",
    "tool": "serving_chat.py:142",
    "start": "api_server.py:1913",
    "routes": "launcher.py:44",
    "shutdown": "launcher.py:103",
}


def logo_lines(version: str, model: str) -> list[str]:
    """``log_version_and_model``'s logo message, one element per line (colours stripped).

    The message starts with a newline, so vLLM's newline formatter prints a first line with the
    prefix and nothing after it, then one prefixed line per logo line.
    """
    return [
        "",
        "       █     █     █▄   ▄█",
        f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
        f"  █▄█▀ █     █     █     █  model   {model}",
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
        "",
    ]


def version_line(version: str, model: str) -> str:
    """The plain version line (``VLLM_DISABLE_LOG_LOGO=1`` or a custom logging config)."""
    return f"vLLM server version {version}, serving model {model}"


def mamba_mode_switched(mode: str) -> str:
    """WARNING when prefix caching is on and the mamba cache mode was ``none``."""
    return (
        f"Mamba cache mode is set to '{mode}' for {HF_ARCHITECTURE} by default when prefix "
        "caching is enabled"
    )


MAMBA_MODE_NONE_WITHOUT_PREFIX = "Mamba cache mode is set to 'none' when prefix caching is disabled"


def mamba_experimental(mode: str) -> str:
    """INFO whenever prefix caching is on for a hybrid model."""
    return (
        f"Warning: Prefix caching in Mamba cache '{mode}' mode is currently enabled. Its support "
        "for Mamba layers is experimental. Please report any issues you may observe."
    )


def async_scheduling_line(enabled: bool) -> str:
    """vLLM's own statement (config/vllm.py), printed before the platform plugin runs."""
    return f"Asynchronous scheduling is {'enabled' if enabled else 'disabled'}."


TT_ASYNC_WARNING = (
    f"Async scheduling was requested, but TT model {TT_MODEL_CLASS} ({TT_MODEL_MODULE}) does "
    "not declare support (`model_capabilities['supports_async_decode']`). Disabling async "
    "scheduling."
)


TT_PREFIX_UNSUPPORTED = (
    f"Prefix caching is not supported in TT backend for {TT_MODEL_MODULE}, disabling it"
)


def prefix_caching_line(enabled: bool) -> str:
    """The TT plugin's statement after it decided (no trailing period, as upstream)."""
    return f"Automatic prefix caching is {'enabled' if enabled else 'disabled'}"


def unknown_tool_parser(parser: str) -> str:
    """``validate_api_server_args``'s KeyError text (its message, before ``repr`` quoting)."""
    return f"invalid tool call parser: {parser} (chose from {{ {','.join(TOOL_CALL_PARSERS)} }})"
