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
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
        (["--tool-call-parser", "qwen4"], "argument --tool-call-parser: invalid choice"),
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


def test_unknown_argument_ends_the_process_with_status_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vmtests.stub.server", "--served-model-name", "x", "--bogus"],
        cwd=PACKAGE_PARENT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "error: unrecognized arguments: --bogus" in result.stderr
    assert "Application startup complete" not in result.stdout
