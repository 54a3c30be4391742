"""The shared comparison functions (vmtests.profiles.expectations) on hand-made inputs."""

from __future__ import annotations

import pytest

from vmtests.profiles import Profile, load_profile
from vmtests.profiles.expectations import (
    match_args,
    match_environment,
    match_hugepages,
    match_module_banner,
    parse_module_banner,
)

GOOD_ARGV = [
    "--model",
    "/models/qwen36",
    "--enable-prefix-caching",
    "--mamba-cache-mode",
    "align",
    "--no-async-scheduling",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "qwen3_coder",
]
GOOD_ENV = {"QWEN36_MERGE_BATCH_GUARD": "1", "QWEN36_SDPA_STREAMING": "1", "PATH": "/bin"}
BANNER = (
    "Nov 30 01:02:03 host tenstorrent-serving-pre-start[42]: tenstorrent-serving-config: "
    "prefix-caching=on mamba-cache-mode=align async-scheduling=off device-resident=off "
    "device-argmax=off sdpa-streaming=on merge-batch-guard=on tool-calling=on "
    "tool-call-parser=qwen3_coder hugepages=2x1G digest=sha256:abc123"
)


@pytest.fixture
def profile() -> Profile:
    return load_profile("cfx-llm2")


def test_the_good_configuration_matches(profile: Profile) -> None:
    assert match_args(profile, GOOD_ARGV) == []
    assert match_environment(profile, GOOD_ENV) == []
    assert match_module_banner(profile, parse_module_banner(BANNER)) == []
    assert match_hugepages(profile, 2, 1048576) == []


def test_a_missing_flag_is_named_with_the_profile(profile: Profile) -> None:
    argv = [token for token in GOOD_ARGV if token != "--no-async-scheduling"]
    (mismatch,) = match_args(profile, argv)
    assert (mismatch.kind, mismatch.subject) == ("arg-missing", "--no-async-scheduling")
    assert mismatch.message.startswith(
        "profile cfx-llm2: `--no-async-scheduling` is missing from the argv"
    )


def test_a_value_must_follow_its_flag_immediately(profile: Profile) -> None:
    # "align" is still in the argv, but not right after --mamba-cache-mode.
    argv = [*GOOD_ARGV[:3], "--mamba-cache-mode", "all", "align", *GOOD_ARGV[5:]]
    (mismatch,) = match_args(profile, argv)
    assert (mismatch.kind, mismatch.subject) == ("arg-value", "--mamba-cache-mode")
    assert "found `all`" in mismatch.message


def test_equals_form_and_last_occurrence_count(profile: Profile) -> None:
    argv = [*GOOD_ARGV, "--mamba-cache-mode=all"]
    (mismatch,) = match_args(profile, argv)
    assert mismatch.kind == "arg-value"
    argv = [*GOOD_ARGV[:3], "--mamba-cache-mode=align", *GOOD_ARGV[5:]]
    assert match_args(profile, argv) == []


def test_a_forbidden_flag_is_reported_but_not_its_negation(profile: Profile) -> None:
    (mismatch,) = match_args(profile, [*GOOD_ARGV, "--async-scheduling"])
    assert (mismatch.kind, mismatch.subject) == ("arg-forbidden", "--async-scheduling")
    assert match_args(profile, GOOD_ARGV) == []  # --no-async-scheduling is not --async-scheduling


def test_environment_missing_wrong_and_forbidden(profile: Profile) -> None:
    env = {"QWEN36_MERGE_BATCH_GUARD": "0", "QWEN36_DEVICE_RESIDENT": "1"}
    kinds = {(m.kind, m.subject) for m in match_environment(profile, env)}
    assert kinds == {
        ("env-value", "QWEN36_MERGE_BATCH_GUARD"),
        ("env-missing", "QWEN36_SDPA_STREAMING"),
        ("env-forbidden", "QWEN36_DEVICE_RESIDENT"),
    }


def test_module_banner_pairs_are_compared(profile: Profile) -> None:
    pairs = parse_module_banner(BANNER.replace("sdpa-streaming=on", "sdpa-streaming=off"))
    (mismatch,) = match_module_banner(profile, pairs)
    assert mismatch.subject == "sdpa-streaming"
    assert "found `sdpa-streaming=off`" in mismatch.message


@pytest.mark.parametrize(
    "line",
    [
        "prefix-caching=on digest=sha256:1",  # no tag
        "tenstorrent-serving-config: prefix-caching=on garbage digest=sha256:1",
        "tenstorrent-serving-config: a=1 a=2 digest=sha256:1",
        "tenstorrent-serving-config: prefix-caching=on",  # no digest
    ],
    ids=["no-tag", "no-equals", "repeated-key", "no-digest"],
)
def test_a_malformed_module_banner_raises(line: str) -> None:
    with pytest.raises(ValueError, match=r"banner|field"):
        parse_module_banner(line)


def test_hugepages_count_and_size(profile: Profile) -> None:
    (wrong_count,) = match_hugepages(profile, 4, 1048576)
    assert "2 x 1G hugepages must be reserved at boot, found 4" in wrong_count.message
    (wrong_size,) = match_hugepages(profile, 2, 2048)
    assert wrong_size.subject == "size"
    assert match_hugepages(load_profile("baseline"), 7, 2048) == []  # no expectation
