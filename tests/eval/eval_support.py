"""Shared helpers of the eval tier: compare a core or module evaluation against a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vmtests.contracts.paths import REPO_ROOT
from vmtests.contracts.serving import Hugepages
from vmtests.nixcore import CoreOutput
from vmtests.nixrun import evaluate_json, nix_value
from vmtests.profiles import Profile, expectations
from vmtests.profiles.expectations import Mismatch

MODULE_EVAL = Path(__file__).resolve().parent / "module-eval.nix"


def configuration_mismatches(
    profile: Profile,
    argv: list[str],
    environment: dict[str, str],
    banner: str,
    hugepages: Hugepages | None,
) -> list[Mismatch]:
    """Everything in ``profile`` that the given argv, environment, banner and hugepages break."""
    mismatches = expectations.match_args(profile, argv) + expectations.match_environment(
        profile, environment
    )
    mismatches += expectations.match_module_banner(
        profile, expectations.parse_module_banner(banner)
    )
    if profile.hugepages is not None:
        # No reservation at all counts as zero pages of the expected size.
        count = hugepages.count if hugepages else 0
        size_kib = hugepages.size_kib if hugepages else profile.hugepages.size_kib
        mismatches += expectations.match_hugepages(profile, count, size_kib)
    return mismatches


def core_mismatches(profile: Profile, output: CoreOutput) -> list[Mismatch]:
    """``configuration_mismatches`` for the output of the Nix core."""
    return configuration_mismatches(
        profile, output.args, output.environment, output.banner, output.hugepages
    )


def explain(mismatches: list[Mismatch]) -> str:
    """One line per mismatch, for assertion messages."""
    return "\n".join(f"  [{m.kind}] {m.message}" for m in mismatches)


def evaluate_module(
    lib_path: Path,
    values: str = "{ }",
    backend: str = "docker",
    host: Path | None = None,
) -> dict[str, Any]:
    """Evaluate the real module with ``lib.evalModules`` (see module-eval.nix).

    ``values`` is a Nix expression for the option values, evaluated in the repository root;
    ``host`` evaluates a host configuration (e.g. hosts/cfx-llm2) instead.
    """
    host_arg = "" if host is None else f"host = {nix_value(REPO_ROOT / host)}; "
    expression = (
        f"import {nix_value(MODULE_EVAL)} {{ lib = import {nix_value(lib_path)}; "
        f"values = {values}; {host_arg}backend = {nix_value(backend)}; }}"
    )
    result: dict[str, Any] = evaluate_json(expression)
    return result


def profile_values(profile: Profile) -> str:
    """The Nix expression importing a profile's serving profile file."""
    return f"(import {nix_value(REPO_ROOT / profile.serving_profile)})"
