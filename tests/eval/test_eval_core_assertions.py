"""(c) Invalid combinations give their documented assertion messages, each saying what to change.

The messages are documented in modules/serving/checks.nix and the README.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vmtests.nixcore import evaluate_core
from vmtests.nixrun import NixError

pytestmark = pytest.mark.nix

CFX_LLM2 = Path("hosts/profiles/cfx-llm2.nix")

# (id, overrides on cfx-llm2, a fragment of the one expected message)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "resident-without-argmax",
        {"deviceResident": True, "deviceArgmax": False},
        "deviceResident requires deviceArgmax",
    ),
    (
        "prefix-with-async",
        {"asyncScheduling": True},
        "prefix sidecars require synchronous local execution",
    ),
    (
        "tool-calling-without-parser",
        {"toolCalling": {"enable": True, "parser": None}},
        "toolCalling.enable needs a parser",
    ),
    ("unknown-mamba-mode", {"mambaCacheMode": "partial"}, "mambaCacheMode must be one of"),
    (
        "prefix-caching-with-mamba-mode-none",
        {"mambaCacheMode": "none"},
        'vLLM keeps prefix caching on and switches the mode itself (to "align" for qwen36',
    ),
    ("bad-hugepage-size", {"hugepages": {"count": 2, "size": "4K"}}, "hugepages.size must be"),
    ("no-devices", {"devices": []}, "devices is empty"),
    ("managed-flag-in-extra-args", {"extraArgs": ["--async-scheduling"]}, "extraArgs must not"),
    (
        "feature-variable-in-extra-environment",
        {"extraEnvironment": {"QWEN36_MERGE_BATCH_GUARD": "0"}},
        "extraEnvironment must not set the feature variables QWEN36_MERGE_BATCH_GUARD",
    ),
    ("misspelled-option", {"enablePrefixCache": True}, "enablePrefixCache is not an option"),
    ("wrong-type", {"port": "8000"}, "port must be one of"),
    (
        "two-features-one-variable",
        {"environmentNames": {"sdpaStreaming": "QWEN36_MERGE_BATCH_GUARD"}},
        "gives two features the same variable",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "fragment"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_combination_fails_with_its_message(
    nix: str, overrides: dict[str, Any], fragment: str
) -> None:
    output = evaluate_core(profile_file=CFX_LLM2, overrides=overrides)
    assert len(output.failed_assertions) == 1, output.failed_assertions
    message = output.failed_assertions[0]
    assert fragment in message
    assert message.startswith("services.tenstorrent-serving."), message


@pytest.mark.parametrize(
    ("overrides", "remedy"),
    [
        ({"deviceResident": True, "deviceArgmax": False}, "deviceArgmax = true"),
        ({"asyncScheduling": True}, "asyncScheduling = null"),
        ({"toolCalling": {"enable": True, "parser": None}}, '"qwen3_coder"'),
        ({"extraArgs": ["--port=9000"]}, "set services.tenstorrent-serving.port instead"),
        ({"mambaCacheMode": "none"}, 'services.tenstorrent-serving.mambaCacheMode = "align"'),
    ],
    ids=["resident", "async", "parser", "extra-args", "mamba-none"],
)
def test_assertion_messages_say_what_to_set(
    nix: str, overrides: dict[str, Any], remedy: str
) -> None:
    (message,) = evaluate_core(profile_file=CFX_LLM2, overrides=overrides).failed_assertions
    assert remedy in message


def test_explicit_synchronous_scheduling_with_prefix_caching_is_valid(nix: str) -> None:
    output = evaluate_core(profile_file=CFX_LLM2, overrides={"asyncScheduling": False})
    assert output.failed_assertions == []
    assert output.args.count("--no-async-scheduling") == 1


def test_async_scheduling_is_automatic_without_prefix_caching(nix: str) -> None:
    output = evaluate_core({})
    assert "--no-async-scheduling" not in output.args
    assert "--async-scheduling" not in output.args
    assert "async-scheduling=auto" in output.banner


def test_mamba_mode_none_without_prefix_caching_is_valid(nix: str) -> None:
    output = evaluate_core({"mambaCacheMode": "none"})
    assert output.failed_assertions == []
    assert "--mamba-cache-mode" not in output.args


def test_mamba_mode_without_prefix_caching_is_a_warning(nix: str) -> None:
    output = evaluate_core({"mambaCacheMode": "all"})
    assert output.failed_assertions == []
    assert any("has no effect while enablePrefixCaching is false" in w for w in output.warnings)


def test_resident_profile_carries_the_advisory_warnings(nix: str) -> None:
    output = evaluate_core(profile_file=Path("hosts/profiles/resident.nix"))
    assert output.failed_assertions == []
    assert any("A/B" in warning for warning in output.warnings), output.warnings
    assert any("256" in warning for warning in output.warnings), output.warnings


def test_environment_names_are_overridable(nix: str) -> None:
    output = evaluate_core(
        profile_file=CFX_LLM2, overrides={"environmentNames": {"sdpaStreaming": "TT_SDPA_STREAM"}}
    )
    assert output.environment.get("TT_SDPA_STREAM") == "1"
    assert "QWEN36_SDPA_STREAMING" not in output.environment
    # The other names keep their features.json defaults.
    assert output.environment.get("QWEN36_MERGE_BATCH_GUARD") == "1"


def test_a_failing_evaluation_reports_nix_stderr(nix: str, tmp_path: Path) -> None:
    broken = tmp_path / "core.nix"
    broken.write_text('values: { args = [ (throw "core exploded") ]; }\n')
    with pytest.raises(NixError, match="core exploded"):
        evaluate_core({}, core_file=broken)
