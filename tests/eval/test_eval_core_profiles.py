"""(b) The Nix core, evaluated for every serving profile, meets that profile's YAML.

Also shows the check can fail: a deliberately broken copy of the core, and an expectation that
does not hold, both fail with messages naming the flag and the profile.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from eval_support import core_mismatches, explain

from vmtests.nixcore import CORE_FILE, evaluate_core
from vmtests.profiles import available_profiles, load_profile

pytestmark = pytest.mark.nix


@pytest.mark.parametrize("name", available_profiles())
def test_core_output_meets_the_profile(nix: str, name: str) -> None:
    profile = load_profile(name)
    output = evaluate_core(profile_file=Path(profile.serving_profile))
    assert output.failed_assertions == [], (
        f"profile {name}: {profile.serving_profile} fails the module's assertions:\n"
        + "\n".join(output.failed_assertions)
    )
    mismatches = core_mismatches(profile, output)
    assert not mismatches, f"profile {name}: the core breaks the expectations:\n" + explain(
        mismatches
    )


def test_the_shipped_profiles_include_production_and_resident() -> None:
    assert {"cfx-llm2", "resident"} <= set(available_profiles())


def test_cfx_llm2_core_prints_the_requested_flags(nix: str) -> None:
    """The issue's acceptance line, checked literally (flag and value adjacent)."""
    args = evaluate_core(profile_file=Path("hosts/profiles/cfx-llm2.nix")).args
    assert "--enable-prefix-caching" in args
    assert "--no-async-scheduling" in args
    index = args.index("--mamba-cache-mode")
    assert args[index + 1] == "align", args


def test_digest_is_sha256_of_the_canonical_json(nix: str) -> None:
    output = evaluate_core(profile_file=Path("hosts/profiles/resident.nix"))
    canonical = json.dumps(
        {"args": output.args, "environment": output.environment},
        separators=(",", ":"),
        sort_keys=True,
    )
    assert output.digest == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert output.banner.endswith(f"digest={output.digest}")


def broken_core(tmp_path: Path, remove: str) -> Path:
    """A copy of modules/serving/ whose core.nix lacks the line containing ``remove``."""
    copy = tmp_path / "serving"
    shutil.copytree(CORE_FILE.parent, copy)
    core = copy / "core.nix"
    lines = core.read_text().splitlines(keepends=True)
    kept = [line for line in lines if remove not in line]
    assert len(kept) == len(lines) - 1, f"expected exactly one line with {remove!r} in core.nix"
    core.write_text("".join(kept))
    return core


def test_a_core_without_no_async_scheduling_fails_naming_flag_and_profile(
    nix: str, tmp_path: Path
) -> None:
    core = broken_core(tmp_path, '(asyncEffective == false) [ "--no-async-scheduling" ]')
    profile = load_profile("cfx-llm2")
    output = evaluate_core(profile_file=Path(profile.serving_profile), core_file=core)
    mismatches = core_mismatches(profile, output)
    missing = [m for m in mismatches if m.kind == "arg-missing"]
    assert [m.subject for m in missing] == ["--no-async-scheduling"], explain(mismatches)
    assert "profile cfx-llm2" in missing[0].message
    assert "`--no-async-scheduling`" in missing[0].message


def test_an_expectation_that_does_not_hold_fails_naming_flag_and_profile(
    nix: str, tmp_path: Path
) -> None:
    source = load_profile("cfx-llm2").source.read_text()
    broken = tmp_path / "cfx-llm2.yaml"
    broken.write_text(
        source.replace(
            "    - --no-async-scheduling",
            "    - --no-async-scheduling\n    - --speculative-decoding",
        )
    )
    profile = load_profile(broken)
    output = evaluate_core(profile_file=Path(profile.serving_profile))
    mismatches = core_mismatches(profile, output)
    assert [(m.kind, m.subject) for m in mismatches] == [("arg-missing", "--speculative-decoding")]
    assert "profile cfx-llm2: `--speculative-decoding` is missing" in mismatches[0].message
