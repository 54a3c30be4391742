"""A service that restarts on its own is not healthy: the snapshot records the unit's
``NRestarts`` and the container's ``RestartCount`` without another command, and
``check_restarts`` fails with the count and the last exit status (no VM)."""

from __future__ import annotations

import json
from pathlib import Path

from scenario_support import INVOCATION, good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.scenario.collection.collect import MARK, UNIT_PROPERTIES, parse_snapshot
from vmtests.scenario.collection.snapshot import JournalLine, Snapshot
from vmtests.scenario.judgement.checks import check_service
from vmtests.scenario.judgement.restarts import check_restarts, last_exit
from vmtests.scenario.judgement.results import failures

DOCKER_INSPECT_SAMPLE = Path(__file__).with_name("data") / "docker-inspect-tenstorrent-serving.json"
UNIT = "tenstorrent-serving.service"
UNIT_RESTARTED = Finding(Check.SERVICE_RESTARTS, Reason.UNIT_RESTARTED)
CONTAINER_RESTARTED = Finding(Check.SERVICE_RESTARTS, Reason.CONTAINER_RESTARTED)


def test_the_unit_properties_asked_include_the_restart_evidence() -> None:
    asked = UNIT_PROPERTIES.split(",")
    assert {"NRestarts", "ExecMainCode", "ExecMainStatus"} <= set(asked)
    assert len(asked) == len(set(asked))


def test_nrestarts_and_the_containers_restart_count_are_parsed() -> None:
    inspect = json.loads(DOCKER_INSPECT_SAMPLE.read_text())
    inspect[0]["RestartCount"] = 3
    inspect[0]["State"]["ExitCode"] = 137
    output = (
        f"{MARK}unit\nActiveState=active\nNRestarts=2\nExecMainCode=0\nExecMainStatus=0\n"
        f"{MARK}container\n{json.dumps(inspect)}\n{MARK}end\n"
    )
    snapshot = parse_snapshot(output, "S1")
    assert snapshot.unit.n_restarts == 2
    assert snapshot.container is not None
    assert (snapshot.container.restart_count, snapshot.container.exit_code) == (3, 137)
    assert snapshot.container.started_at == "2026-11-30T01:33:52.100864325Z"
    again = Snapshot.from_dict(snapshot.to_dict())
    assert again.container is not None
    assert again.container.restart_count == 3


def test_a_steady_unit_passes_and_says_so() -> None:
    (result,) = check_restarts(good_snapshot())
    assert result.ok
    assert result.check == Check.SERVICE_RESTARTS
    assert "restarted 0 times" in result.message


def _crashed_once(snapshot: Snapshot) -> None:
    """What the journal and ``systemctl show`` hold after one automatic restart."""
    ended = "0123456789abcdef0123456789abcdef"
    snapshot.unit.properties["NRestarts"] = "1"
    snapshot.journal[:0] = [
        JournalLine(f"{UNIT}: Main process exited, code=exited, status=1/FAILURE", "b", ended),
        JournalLine(f"{UNIT}: Failed with result 'exit-code'.", "b", ended),
        JournalLine(f"{UNIT}: Scheduled restart job, restart counter is at 1.", "b", ended),
    ]


def test_a_unit_that_restarted_on_its_own_fails_with_its_count_and_last_exit() -> None:
    snapshot = good_snapshot()
    _crashed_once(snapshot)
    found = failures(check_service(snapshot))
    assert [r.finding for r in found] == [UNIT_RESTARTED]
    message = found[0].message
    assert "restarted on its own 1 time(s)" in message
    assert "NRestarts=1" in message
    assert "code=exited, status=1/FAILURE" in message
    assert "0123456789abcdef0123456789abcdef" in message
    assert f"journalctl -b -u {UNIT}" in message
    # It answers all the same: only the restart fails.
    assert snapshot.health.status == 200


def test_the_last_exit_is_the_last_main_process_line() -> None:
    snapshot = good_snapshot()
    _crashed_once(snapshot)
    snapshot.journal.insert(
        1, JournalLine(f"{UNIT}: Main process exited, code=killed, status=9/KILL", "b", "x")
    )
    assert last_exit(snapshot).startswith("code=killed, status=9/KILL")


def test_a_failed_unit_without_the_journal_line_reports_its_exec_main_status() -> None:
    snapshot = good_snapshot()
    snapshot.unit.properties.update(
        NRestarts="5", ActiveState="failed", MainPID="0", ExecMainCode="1", ExecMainStatus="1"
    )
    (result,) = failures(check_restarts(snapshot))
    assert "ExecMainCode=1, status=1" in result.message
    assert "failed now" in result.message


def test_a_restart_with_no_exit_line_still_fails() -> None:
    snapshot = good_snapshot()
    snapshot.unit.properties["NRestarts"] = "2"
    (result,) = failures(check_restarts(snapshot))
    assert result.finding == UNIT_RESTARTED
    assert "not in this boot's journal" in result.message


def test_a_container_the_engine_restarted_fails_although_the_unit_did_not() -> None:
    snapshot = good_snapshot()
    inspect = json.loads(DOCKER_INSPECT_SAMPLE.read_text())
    inspect[0]["RestartCount"] = 2
    with_container = parse_snapshot(f"{MARK}container\n{json.dumps(inspect)}\n{MARK}end\n", "S1")
    snapshot.container = with_container.container
    found = failures(check_restarts(snapshot))
    assert [r.finding for r in found] == [CONTAINER_RESTARTED]
    assert "2 time(s)" in found[0].message
    assert "RestartCount=2" in found[0].message
    assert "docker logs tenstorrent-serving" in found[0].message


def test_no_nrestarts_is_incomplete_evidence_not_a_pass() -> None:
    snapshot = good_snapshot()
    del snapshot.unit.properties["NRestarts"]
    (result,) = failures(check_restarts(snapshot))
    assert result.finding == Finding(Check.SERVICE_RESTARTS, Reason.INCOMPLETE_SNAPSHOT)


def test_the_current_start_is_untouched_by_the_restart_evidence() -> None:
    """The lines about the ended run carry its invocation: the banners still count only from
    the current start."""
    snapshot = good_snapshot()
    _crashed_once(snapshot)
    assert snapshot.unit.invocation_id == INVOCATION
    assert all("Main process exited" not in line.message for line in snapshot.current_lines())
