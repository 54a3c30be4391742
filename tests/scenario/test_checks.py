"""Unit tests of the profile and consistency checks on synthetic snapshots: each can fail."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from scenario_support import EARLIER_BOOT, GIB_KIB, UNIT_FILE, good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.profiles import load_profile
from vmtests.scenario.collection.snapshot import CONTAINER_LOG, JournalLine, Snapshot
from vmtests.scenario.judgement.checks import (
    check_consistency,
    check_evidence,
    check_profile,
    check_service,
    evaluate_stage,
    profile_rows,
)
from vmtests.scenario.judgement.results import failures

CFX = load_profile("cfx-llm2")
RESIDENT = load_profile("resident")


@pytest.mark.parametrize(("profile", "resident"), [(CFX, False), (RESIDENT, True)])
def test_correct_snapshot_has_no_failure(profile: object, resident: bool) -> None:
    snapshot = good_snapshot(resident=resident)
    results = evaluate_stage(profile, snapshot)  # type: ignore[arg-type]
    assert failures(results) == []
    # Every expectation of the profile produced a passing result of its own.
    rows = profile_rows(profile)  # type: ignore[arg-type]
    checked = {(r.check, r.subject) for r in results if r.ok}
    assert {(row.check, row.subject) for row in rows} <= checked


def test_cfx_snapshot_fails_the_resident_profile() -> None:
    results = failures(check_profile(RESIDENT, good_snapshot(resident=False)))
    subjects = {r.subject for r in results}
    assert {"QWEN36_DEVICE_RESIDENT", "qwen36-device-resident", "device-resident"} <= subjects


def _drop_arg(flag: str) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        assert snapshot.server is not None
        snapshot.server.argv.remove(flag)

    return mutate


def _add_arg(flag: str) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        assert snapshot.server is not None
        snapshot.server.argv.append(flag)

    return mutate


def _set_env(name: str, value: str | None) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        assert snapshot.server is not None
        if value is None:
            del snapshot.server.environment[name]
        else:
            snapshot.server.environment[name] = value

    return mutate


def _drop_lines(text: str) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        snapshot.journal = [line for line in snapshot.journal if text not in line.message]

    return mutate


def _add_line(text: str) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        last = snapshot.journal[-1]
        snapshot.journal.append(JournalLine(text, last.boot_id, last.invocation_id))

    return mutate


def _module_banner(old: str, new: str) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        for line in snapshot.journal:
            line.message = line.message.replace(old, new)

    return mutate


def _hugepages(count: int) -> Callable[[Snapshot], None]:
    def mutate(snapshot: Snapshot) -> None:
        snapshot.hugepages.pools[GIB_KIB] = count

    return mutate


ARGS, ENV, BANNER = Check.PROFILE_ARGS, Check.PROFILE_ENV, Check.PROFILE_BANNER
BREAKAGES: list[tuple[str, Check, Callable[[Snapshot], None], str]] = [
    ("--no-async-scheduling", ARGS, _drop_arg("--no-async-scheduling"), "is missing"),
    ("--async-scheduling", ARGS, _add_arg("--async-scheduling"), "must not appear"),
    ("QWEN36_SDPA_STREAMING", ENV, _set_env("QWEN36_SDPA_STREAMING", None), "not set"),
    ("QWEN36_MERGE_BATCH_GUARD", ENV, _set_env("QWEN36_MERGE_BATCH_GUARD", "0"), "`1`"),
    ("QWEN36_DEVICE_RESIDENT", ENV, _set_env("QWEN36_DEVICE_RESIDENT", "1"), "absent"),
    ("qwen36-sdpa-streaming", BANNER, _drop_lines("SDPA streaming"), "missing from"),
    (
        "vllm-async-enabled",
        BANNER,
        _add_line("Asynchronous scheduling is enabled."),
        "must not appear",
    ),
    (
        "merge-batch-guard",
        Check.PROFILE_MODULE_BANNER,
        _module_banner("merge-batch-guard=on", "merge-batch-guard=off"),
        "merge-batch-guard=on",
    ),
    (
        "present",
        Check.PROFILE_MODULE_BANNER,
        _drop_lines("tenstorrent-serving-config"),
        "no module",
    ),
    ("hugepages", Check.PROFILE_HUGEPAGES, _hugepages(1), "found 1"),
]
REASONS = {
    "--no-async-scheduling": Reason.ARG_MISSING,
    "--async-scheduling": Reason.ARG_FORBIDDEN,
    "QWEN36_SDPA_STREAMING": Reason.ENV_MISSING,
    "QWEN36_MERGE_BATCH_GUARD": Reason.ENV_VALUE,
    "QWEN36_DEVICE_RESIDENT": Reason.ENV_FORBIDDEN,
    "qwen36-sdpa-streaming": Reason.BANNER_MISSING,
    "vllm-async-enabled": Reason.BANNER_FORBIDDEN,
    "merge-batch-guard": Reason.MODULE_BANNER_VALUE,
    "present": Reason.MODULE_BANNER_MISSING,
    "hugepages": Reason.HUGEPAGES_COUNT,
}
"""Why each breakage fails: the reason its result must carry."""


@pytest.mark.parametrize(
    ("subject", "check", "mutate", "needle"), BREAKAGES, ids=[b[0] for b in BREAKAGES]
)
def test_each_profile_expectation_can_fail(
    subject: str, check: Check, mutate: Callable[[Snapshot], None], needle: str
) -> None:
    finding = Finding(check, REASONS[subject])
    snapshot = good_snapshot()
    mutate(snapshot)
    found = failures(check_profile(CFX, snapshot))
    if subject == "present":  # without a module banner, none of its keys can hold either
        assert {r.check for r in found} == {finding.check}
        assert len(found) == 1 + len(CFX.module_banner)
    else:
        assert [(r.finding, r.subject) for r in found] == [(finding, subject)], found
    assert found[0].finding == finding
    assert needle in found[0].message
    assert found[0].message.startswith("after the switch (S1): ")


def test_after_reboot_message_says_it_held_before_and_where_it_came_from() -> None:
    before = good_snapshot(label="S1")
    drop_in = "/run/systemd/system/tenstorrent-serving.service.d/50-validated.conf"
    before.unit.properties["DropInPaths"] = drop_in
    before.unit.files[drop_in] = "[Service]\nExecStart=... --no-async-scheduling ..."
    # The durable unit file lacks the flag: only the /run drop-in set it.
    before.unit.files[UNIT_FILE] = before.unit.files[UNIT_FILE].replace(
        " --no-async-scheduling", ""
    )
    after = good_snapshot(label="S2")
    _drop_arg("--no-async-scheduling")(after)
    found = failures(check_profile(CFX, after, previous=before))
    assert len(found) == 1
    message = found[0].message
    assert message.startswith("after the reboot (S2): ")
    assert "`--no-async-scheduling` is missing from the argv" in message
    assert "it held after the switch (S1)" in message
    assert f"it came from drop-in {drop_in} (runtime-only, under /run)" in message


def test_banner_from_an_earlier_boot_is_stale() -> None:
    snapshot = good_snapshot(label="S2")
    sdpa = [line for line in snapshot.journal if "SDPA streaming" in line.message]
    _drop_lines("SDPA streaming")(snapshot)
    snapshot.earlier_journal = [JournalLine(sdpa[0].message, EARLIER_BOOT, "old")]
    found = failures(check_profile(CFX, snapshot))
    assert [r.subject for r in found] == ["qwen36-sdpa-streaming"]
    assert found[0].reason == Reason.BANNER_STALE
    assert f"seen only in an earlier boot ({EARLIER_BOOT})" in found[0].message
    assert "a stale banner does not count" in found[0].message


def test_banner_from_an_earlier_start_in_this_boot_does_not_count() -> None:
    snapshot = good_snapshot()
    for line in snapshot.journal:
        if "SDPA streaming" in line.message:
            line.invocation_id = "an-earlier-invocation"
    found = failures(check_profile(CFX, snapshot))
    assert [r.subject for r in found] == ["qwen36-sdpa-streaming"]
    assert found[0].reason == Reason.BANNER_EARLIER_START
    assert "earlier start of the unit (invocation an-earlier-invocation)" in found[0].message


def test_a_banner_the_journal_lost_is_found_in_the_container_log() -> None:
    snapshot = good_snapshot()
    sdpa = [line for line in snapshot.journal if "SDPA streaming" in line.message]
    _drop_lines("SDPA streaming")(snapshot)
    assert [r.subject for r in failures(check_profile(CFX, snapshot))] == ["qwen36-sdpa-streaming"]
    snapshot.container_log = [JournalLine(sdpa[0].message, source=CONTAINER_LOG)]
    results = check_profile(CFX, snapshot)
    assert failures(results) == []
    found = next(r for r in results if r.subject == "qwen36-sdpa-streaming")
    assert found.message.startswith("logged (in the container log): ")
    assert failures(check_consistency(snapshot)) == []


def test_consistency_banner_without_its_switch() -> None:
    snapshot = good_snapshot()
    _set_env("QWEN36_SDPA_STREAMING", None)(snapshot)
    found = failures(check_consistency(snapshot))
    assert [(r.subject, r.reason) for r in found] == [
        ("sdpaStreaming", Reason.CLAIM_WITHOUT_SWITCH)
    ]
    assert "claims sdpaStreaming is on, but the live argv/env do not turn it on" in (
        found[0].message
    )


def test_consistency_switch_without_its_banner() -> None:
    snapshot = good_snapshot()
    _drop_lines("merge batch guard")(snapshot)
    found = failures(check_consistency(snapshot))
    assert [(r.subject, r.reason) for r in found] == [
        ("mergeBatchGuard", Reason.SWITCH_WITHOUT_CLAIM)
    ]
    assert "QWEN36_MERGE_BATCH_GUARD=1 in the environment turns mergeBatchGuard on" in (
        found[0].message
    )


def test_consistency_detail_mismatch() -> None:
    snapshot = good_snapshot()
    assert snapshot.server is not None
    argv = snapshot.server.argv
    argv[argv.index("--mamba-cache-mode") + 1] = "all"
    found = failures(check_consistency(snapshot))
    assert [(r.subject, r.reason) for r in found] == [
        ("prefixCaching", Reason.CLAIM_DETAIL_DIFFERS)
    ]
    assert "says `align`" in found[0].message
    assert "says `all`" in found[0].message


def test_consistency_without_a_process() -> None:
    snapshot = good_snapshot()
    snapshot.main_process = None
    found = failures(check_consistency(snapshot))
    assert found[0].finding == Finding(Check.CONSISTENCY, Reason.NO_PROCESS)
    assert "no serving process" in found[0].message


def test_service_checks_fail_on_inactive_unit_and_dead_endpoints() -> None:
    snapshot = good_snapshot()
    snapshot.unit.properties["ActiveState"] = "failed"
    snapshot.health.status = None
    snapshot.health.error = "curl: (7) Failed to connect"
    snapshot.models.body = '{"object": "list", "data": []}'
    found = {r.check: r for r in failures(check_service(snapshot))}
    assert found[Check.SERVICE_ACTIVE].reason == Reason.NOT_ACTIVE
    assert "is failed" in found[Check.SERVICE_ACTIVE].message
    assert found[Check.SERVICE_HEALTH].reason == Reason.NOT_ANSWERING
    assert "Failed to connect" in found[Check.SERVICE_HEALTH].message
    assert found[Check.SERVICE_MODELS].reason == Reason.NO_MODEL
    assert "the model list is empty" in found[Check.SERVICE_MODELS].message


def test_a_section_that_could_not_be_read_fails_naming_it() -> None:
    snapshot = good_snapshot()
    assert [r.ok for r in check_evidence(snapshot)] == [True]
    snapshot.errors.append("container inspect failed: sh: 1: docker: not found")
    found = [r for r in failures(check_service(snapshot)) if r.check == Check.SNAPSHOT_EVIDENCE]
    assert len(found) == 1
    assert found[0].reason == Reason.INCOMPLETE_SNAPSHOT
    assert "docker: not found" in found[0].message
    # Every consumer (scenario, controls, certification) goes through check_service.
    assert found[0] in failures(evaluate_stage(CFX, snapshot))
