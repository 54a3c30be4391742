"""The card as tt-smi sees it: a P150 is there and a process holds it while serving runs.

Reads ``tt-smi -s`` from the snapshot through ``vmtests.tt_smi_parse`` (the one tt-smi reader,
shared with the certification preflight). A host without tt-smi is reported as information, and
so are the card's holders where the tools cannot list them (tt-smi before 6.0.0, tt-kmd before
2.5.0), with the versions found. tt-smi's own entry among the holders is not a holder: it opened
the card to take the snapshot.
"""

from __future__ import annotations

from vmtests.contracts.findings import Check, Reason
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.results import CheckResult, as_informational, failed, passed
from vmtests.tt_smi_parse import NAMESPACED_PIDS_SINCE_TT_KMD, TtSmiError, dotted, parse_snapshot


def check_card(snapshot: Snapshot) -> list[CheckResult]:
    """tt-smi answers, lists a P150 whose id decodes to its type, and the card is held."""
    stage, result = snapshot.label, snapshot.tt_smi
    if result.status is None:
        note = passed(stage, Check.CARD, "tt-smi", f"card not inspected: {result.error}")
        return as_informational([note])
    if result.status != 0:
        first = next((line for line in result.body.splitlines() if line.strip()), "")
        message = f"tt-smi -s exited {result.status}: {first.strip()}"
        return [failed(stage, Check.CARD, "tt-smi", Reason.TT_SMI_FAILED, message)]
    try:
        card = parse_snapshot(result.body)
    except TtSmiError as error:
        return [failed(stage, Check.CARD, "tt-smi", Reason.TT_SMI_UNREADABLE, str(error))]
    p150 = [board for board in card.boards if board.is_p150]
    if not p150:
        seen = ", ".join(f"{b.board_type} ({b.board_id})" for b in card.boards) or "no board"
        return [
            failed(
                stage, Check.CARD, "board", Reason.NO_P150, f"tt-smi lists no P150 board: {seen}"
            )
        ]
    boards = ", ".join(f"{b.board_type} {b.board_id} at {b.bus_id}" for b in p150)
    results = [passed(stage, Check.CARD, "board", f"{boards} ({card.driver})")]
    unknown = card.holders_unknown()
    if unknown:
        note = passed(stage, Check.CARD, "holder", f"holders not inspectable: {unknown}")
        return [*results, *as_informational([note])]
    holders = [f"pid {p.pid} on device {p.device}" for p in card.card_users]
    kmd = card.driver_version
    if holders and kmd is not None and kmd < NAMESPACED_PIDS_SINCE_TT_KMD:
        since = dotted(NAMESPACED_PIDS_SINCE_TT_KMD)
        holders.append(f"(pids as tt-kmd {dotted(kmd)} records them: a container's "
                       f"own pids before tt-kmd {since})")  # fmt: skip
    if snapshot.unit.active_state == "active" and not holders:
        results.append(
            failed(
                stage,
                Check.CARD,
                "holder",
                Reason.CARD_NOT_HELD,
                f"{snapshot.unit.name} is active but tt-smi shows no process holding the card",
            )
        )
    else:
        results.append(passed(stage, Check.CARD, "holder", ", ".join(holders) or "card idle"))
    return results
