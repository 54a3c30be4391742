"""The stub's command line: the real vLLM spellings parse, everything else is an argparse error."""

from __future__ import annotations

import subprocess
import sys

import pytest
from stub_support import PRODUCTION_ARGS

from vmtests.guest.local_stub import PACKAGE_PARENT
from vmtests.stub.args import parse_args


def test_production_command_line_parses_with_vllm_defaults_filled_in() -> None:
    args, parser = parse_args([*PRODUCTION_ARGS, "--host", "0.0.0.0", "--port", "8000"])
    assert args.enable_prefix_caching is True
    assert args.mamba_cache_mode == "align"
    assert args.async_scheduling is False
    assert args.enable_auto_tool_choice is True
    assert args.tool_call_parser == "qwen3_coder"
    assert args.model_name == "qwen36"
    assert args.effective_block_size == 64
    non_default = args.non_default(parser)
    assert non_default["async_scheduling"] is False
    assert "max_num_seqs" not in non_default  # left at its default


def test_negative_spellings_and_human_readable_lengths() -> None:
    args, _ = parse_args(
        ["--no-enable-prefix-caching", "--async-scheduling", "--max-model-len", "32k"]
    )
    assert args.enable_prefix_caching is False
    assert args.async_scheduling is True
    assert args.max_model_len == 32000
    assert parse_args(["--additional-config", '{"tt": {"trace": true}}'])[0].additional_config == {
        "tt": {"trace": True}
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--enable-prefix-cache"], "unrecognized arguments: --enable-prefix-cache"),
        (["--mamba-cache-mode", "aligned"], "argument --mamba-cache-mode: invalid choice"),
        (["--additional-config", "{tt:"], "argument --additional-config: invalid loads value"),
        (["--additional-config", "[1]"], "argument --additional-config: invalid loads value"),
        (["--block-size", "0"], "argument --block-size: invalid int value"),
        (["--port", "http"], "argument --port: invalid int value"),
        (["--max-num-seqs"], "argument --max-num-seqs: expected one argument"),
    ],
)
def test_invalid_arguments_are_argparse_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "usage: vllm serve" in stderr
    assert message in stderr


def run_server(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run the stub server with ``argv`` to its exit (these command lines never serve)."""
    return subprocess.run(
        [sys.executable, "-m", "vmtests.stub.server", *argv],
        cwd=PACKAGE_PARENT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_unknown_argument_ends_the_process_with_status_2() -> None:
    result = run_server("--served-model-name", "x", "--bogus")
    assert result.returncode == 2
    assert "error: unrecognized arguments: --bogus" in result.stderr
    assert "Application startup complete" not in result.stdout


def test_auto_tool_choice_without_parser_is_vllms_type_error() -> None:
    """vLLM entrypoints/openai/cli_args.py raises TypeError after parsing, not argparse."""
    result = run_server("--enable-auto-tool-choice")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"
    )
    assert "usage:" not in result.stderr
    assert "Application startup complete" not in result.stdout


def test_unknown_tool_call_parser_fails_at_server_setup_not_in_argparse() -> None:
    """vLLM api_server.py validate_api_server_args: a KeyError after the version line."""
    result = run_server("--enable-auto-tool-choice", "--tool-call-parser", "qwen4")
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith("KeyError: 'invalid tool call parser: qwen4 (chose from { "), last
    assert ",qwen3_coder," in last
    assert "non-default args: {" in result.stdout  # argparse accepted it
    assert "Application startup complete" not in result.stdout


def test_a_parser_without_auto_tool_choice_is_not_validated() -> None:
    args, _ = parse_args(["--tool-call-parser", "qwen4"])
    assert args.tool_call_parser == "qwen4"
