"""The card check reads tt-smi -s through vmtests.tt_smi_parse."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scenario_support import good_snapshot

from vmtests.scenario.collection.collect import MARK, parse_snapshot
from vmtests.scenario.collection.snapshot import Endpoint
from vmtests.scenario.judgement.card import check_card
from vmtests.scenario.judgement.results import failures
from vmtests.tt_smi_parse import OWN_PID_LINE

SAMPLE = Path(__file__).parents[1] / "stub" / "data" / "tt-smi-6.2.1-snapshot.json"


def test_the_real_sample_passes_with_board_and_holder() -> None:
    snapshot = good_snapshot()
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, SAMPLE.read_text())
    results = check_card(snapshot)
    assert failures(results) == []
    assert [r.message for r in results] == [
        "p150b 000004110233c21a at 0000:c1:00.0 (TT-KMD 2.10.0)",
        "pid 48213 on device 0",
    ]


def test_no_driver_fails_with_tt_smis_own_line() -> None:
    snapshot = good_snapshot()
    body = "\x1b[31m No Tenstorrent driver detected! Please install driver using tt-kmd \x1b[0m"
    snapshot.tt_smi = Endpoint("tt-smi -s", 1, body)
    (bad,) = failures(check_card(snapshot))
    assert "tt-smi -s exited 1: \x1b[31m No Tenstorrent driver detected!" in bad.message


def test_a_board_that_is_not_a_p150_fails() -> None:
    data = json.loads(SAMPLE.read_text())
    data["device_info"][0]["board_info"].update(board_type="n300", board_id="0000014000000000")
    snapshot = good_snapshot()
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, json.dumps(data))
    (bad,) = failures(check_card(snapshot))
    assert "tt-smi lists no P150 board: n300 (0000014000000000)" in bad.message


def test_an_active_service_with_nobody_holding_the_card_fails() -> None:
    data = json.loads(SAMPLE.read_text())
    data["processes"] = []
    snapshot = good_snapshot()
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, json.dumps(data, indent=4))
    (bad,) = failures(check_card(snapshot))
    assert "is active but tt-smi shows no process holding the card" in bad.message


TT_SMI_ITSELF = {
    "pid": 4242, "user": "root", "device": 0,
    "cmdline": "/nix/store/0123-tt-smi-3.0.30/bin/.tt-smi-wrapped -s --snapshot_no_tty",
}  # fmt: skip
"""tt-smi's own entry: it opens the card to take the snapshot (tt-smi issue 260)."""


def test_tt_smi_itself_does_not_hold_the_card_for_the_server() -> None:
    data = json.loads(SAMPLE.read_text())
    data["processes"] = [TT_SMI_ITSELF]
    snapshot = good_snapshot()
    body = f"{OWN_PID_LINE}4242\n{json.dumps(data, indent=4)}"  # as SNAPSHOT_COMMAND prints it
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, body)
    (bad,) = failures(check_card(snapshot))
    assert "is active but tt-smi shows no process holding the card" in bad.message
    data["processes"].append({**TT_SMI_ITSELF, "pid": 48213, "cmdline": "python3 -m vllm"})
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, f"{OWN_PID_LINE}4242\n{json.dumps(data)}")
    results = check_card(snapshot)
    assert failures(results) == []
    assert results[-1].message == "pid 48213 on device 0"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda data: data.pop("processes"), "tt-smi prints no processes before 6.0.0"),
        (
            lambda data: (
                data.update(processes=[]) or data["host_info"].update(Driver="TT-KMD 2.4.1")
            ),
            "tt-kmd lists the processes that hold a card only since 2.5.0",
        ),
    ],
    ids=["tt-smi-5", "tt-kmd-2.4"],
)
def test_older_tools_leave_the_holders_not_inspectable(
    change: Callable[[dict[str, Any]], object], why: str
) -> None:
    """Not a crash and not a failure: information, with the versions found."""
    data = json.loads(SAMPLE.read_text())
    change(data)
    snapshot = good_snapshot()
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, json.dumps(data, indent=4))
    results = check_card(snapshot)
    assert failures(results) == []
    (note,) = [r for r in results if r.subject == "holder"]
    assert note.informational
    assert why in note.message
    assert "driver TT-KMD" in note.message


def test_a_driver_before_2_7_says_its_pids_are_the_containers() -> None:
    data = json.loads(SAMPLE.read_text())
    data["host_info"]["Driver"] = "TT-KMD 2.6.0"
    snapshot = good_snapshot()
    snapshot.tt_smi = Endpoint("tt-smi -s", 0, json.dumps(data, indent=4))
    (holder,) = [r for r in check_card(snapshot) if r.subject == "holder"]
    assert holder.ok
    assert "a container's own pids before tt-kmd 2.7.0" in holder.message


def test_without_tt_smi_the_card_is_information_only() -> None:
    snapshot = parse_snapshot(f"{MARK}tt_smi\ntt-smi: not installed\n", "S1")
    (note,) = check_card(snapshot)
    assert note.informational
    assert note.message == "card not inspected: tt-smi: not installed"


def test_the_snapshot_script_output_carries_tt_smi() -> None:
    output = f"{MARK}tt_smi\n" + SAMPLE.read_text() + f"\n0\n{MARK}end\n"
    snapshot = parse_snapshot(output, "S1")
    assert snapshot.tt_smi.status == 0
    assert check_card(snapshot)[0].ok
