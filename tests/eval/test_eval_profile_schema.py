"""The YAML schema: every shipped profile loads, and mistakes name file, key path and need."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vmtests.profiles import ProfileError, available_profiles, load_profile

VALID = """\
description: test profile
serving_profile: hosts/profiles/cfx-llm2.nix
args:
  present:
    - --enable-prefix-caching
    - {flag: --mamba-cache-mode, value: align}
  absent: [--async-scheduling]
environment:
  set: {QWEN36_MERGE_BATCH_GUARD: "1"}
  set_features: {sdpaStreaming: "1"}
  absent_features: [deviceResident]
banners:
  present:
    - {name: sdpa, pattern: 'qwen36: SDPA streaming ACTIVE'}
module_banner: {prefix-caching: "on"}
hugepages: {count: 2, size: 1G}
"""


def write(tmp_path: Path, text: str, name: str = "sample") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_valid_profile_loads_with_features_resolved(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path, VALID))
    assert profile.name == "sample"
    assert [(a.flag, a.value) for a in profile.args_present] == [
        ("--enable-prefix-caching", None),
        ("--mamba-cache-mode", "align"),
    ]
    assert dict(profile.env_set) == {
        "QWEN36_MERGE_BATCH_GUARD": "1",
        "QWEN36_SDPA_STREAMING": "1",
    }
    assert profile.env_absent == ("QWEN36_DEVICE_RESIDENT",)
    assert profile.hugepages is not None
    assert profile.hugepages.size_kib == 1048576
    assert profile.banners_present[0].pattern.search("x qwen36: SDPA streaming ACTIVE")


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_loads(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.args_present or profile.args_absent


MISTAKES = [
    ("unknown-key", VALID + "timeout: 3\n", "timeout: expected one of the keys"),
    (
        "unknown-nested-key",
        VALID.replace("  absent: [--async-scheduling]", "  forbidden: [--async-scheduling]"),
        "args.forbidden: expected one of the keys absent, present",
    ),
    (
        "wrong-type",
        VALID.replace('set: {QWEN36_MERGE_BATCH_GUARD: "1"}', "set: {QWEN36_MERGE_BATCH_GUARD: 1}"),
        "environment.set.QWEN36_MERGE_BATCH_GUARD: expected a string, got 1 (int)",
    ),
    (
        "bad-regex",
        VALID.replace("'qwen36: SDPA streaming ACTIVE'", "'qwen36: (SDPA'"),
        "banners.present[0].pattern: expected a valid regular expression",
    ),
    ("empty-file", "", "<top level>: expected a profile mapping with expectations"),
    (
        "no-expectations",
        "description: x\nserving_profile: hosts/profiles/cfx-llm2.nix\n",
        "<top level>: expected at least one non-empty expectation section",
    ),
    (
        "duplicate-flag",
        VALID.replace("    - --enable-prefix-caching\n", "    - --enable-prefix-caching\n" * 2),
        "args.present[1]: expected each entry once; '--enable-prefix-caching' is a duplicate",
    ),
    (
        "flag-present-and-absent",
        VALID.replace("absent: [--async-scheduling]", "absent: [--enable-prefix-caching]"),
        "args.absent[0]: expected a flag not also in args.present",
    ),
    (
        "duplicate-yaml-key",
        VALID + "hugepages: {count: 4, size: 1G}\n",
        "duplicate key 'hugepages'",
    ),
    (
        "unknown-feature",
        VALID.replace("absent_features: [deviceResident]", "absent_features: [residentDecode]"),
        "environment.absent_features[0]: expected a feature of features.json",
    ),
    (
        "bad-hugepage-size",
        VALID.replace("size: 1G", "size: 1GB"),
        "hugepages.size: expected one of 1G, 2M, got '1GB'",
    ),
    (
        "missing-serving-profile-file",
        VALID.replace("hosts/profiles/cfx-llm2.nix", "hosts/profiles/nope.nix"),
        "serving_profile: expected an existing file",
    ),
    (
        "flag-with-value-in-one-string",
        VALID.replace("    - --enable-prefix-caching\n", "    - --mamba-cache-mode align\n"),
        "args.present[0]: expected a single command-line flag",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES]
)
def test_a_mistake_names_file_key_path_and_expectation(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as raised:
        load_profile(path)
    message = str(raised.value)
    assert str(path) in message
    assert expected in message, message


def test_name_must_match_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=re.escape("name: expected the file's stem 'sample'")):
        load_profile(write(tmp_path, "name: other\n" + VALID))


def test_an_unknown_bare_name_lists_the_available_profiles() -> None:
    with pytest.raises(ProfileError, match=r"available profiles: .*cfx-llm2"):
        load_profile("no-such-profile")
