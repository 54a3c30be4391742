"""``--keep``, ``vmtests attach``, ``vmtests stop`` and ``--deadline`` on the reference guest.

The commands run as the person runs them (``python3 -m vmtests.cli`` in a process of its own,
which ends before the kept guest does, ``cli_support``), with ``TMPDIR`` in the test's directory
so that the guest's processes are told apart from other runs' by the paths on their command
lines. A check of cfx-llm2 against the base fails fast, from the base deployment restored from
the snapshot cache (``vmtests.scenario.prepared``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_support import qemus_under, vmtests

from vmtests.contracts.status import ExitStatus
from vmtests.driver import keep
from vmtests.scenario.collection.evidence import EVIDENCE_TIMEOUT

pytestmark = [pytest.mark.vm, pytest.mark.nix, pytest.mark.guest_seconds(400)]


def kept_check(tmp_path: Path, keep_for: float) -> tuple[Path, keep.KeptState]:
    """A failing ``vmtests check --keep`` (cfx-llm2 against the base); the state it printed."""
    done = vmtests(
        tmp_path, "check", "--profile", "cfx-llm2", "--target", "qemu:reference", "--keep",
        "--keep-for", str(keep_for), "--report-dir", str(tmp_path / "report"),
    )  # fmt: skip
    assert done.returncode == ExitStatus.FAILED, done.stderr[-2000:]
    attach = [line for line in done.stdout.splitlines() if "vmtests attach " in line]
    stop = [line for line in done.stdout.splitlines() if line.startswith("stop it: vmtests stop ")]
    assert len(attach) == 1, done.stdout
    assert len(stop) == 1, done.stdout
    state = Path(stop[0].split("vmtests stop ", 1)[1])
    assert attach[0].endswith(f"vmtests attach {state}")
    assert (tmp_path / "report" / "report.json").exists()
    return state, keep.read_state(state)


def test_a_kept_guest_answers_attach_and_stop_leaves_nothing(tmp_path: Path) -> None:
    state, kept = kept_check(tmp_path, keep_for=600)
    assert qemus_under(tmp_path) == [kept.qemu_pid]  # exactly one, though the run has ended
    done = vmtests(tmp_path, "attach", str(state), "--", "systemctl", "is-system-running")
    assert done.stdout.strip() in {"running", "degraded"}, done.stderr
    assert vmtests(tmp_path, "attach", str(state), "--", "sh", "-c", "exit 7").returncode == 7
    stopped = vmtests(tmp_path, "stop", str(state), timeout=180)
    assert stopped.returncode == 0
    assert "asked the guest to power off" in stopped.stdout
    assert qemus_under(tmp_path) == []
    assert not keep.alive(kept.keeper_pid, kept.keeper_start)
    assert not state.exists()
    assert not Path(kept.qmp_socket).parent.exists()


@pytest.mark.nightly
def test_a_kept_guest_powers_itself_off_after_its_limit(tmp_path: Path) -> None:
    limit = 20.0
    state, kept = kept_check(tmp_path, keep_for=limit)
    assert keep.alive(kept.qemu_pid, kept.qemu_start)
    bound = time.monotonic() + limit + keep.POWERDOWN_GRACE + keep.QUIT_GRACE + 30

    def left() -> bool:  # the keeper ends last: it removes the state, then exits
        alive = keep.alive(kept.keeper_pid, kept.keeper_start)
        return bool(qemus_under(tmp_path)) or state.exists() or alive

    while time.monotonic() < bound and left():
        time.sleep(0.5)
    assert qemus_under(tmp_path) == [], f"still running {bound:.0f}s after the keep"
    assert not keep.alive(kept.keeper_pid, kept.keeper_start)
    assert not state.exists()


def test_a_run_past_its_deadline_exits_3_naming_the_step(tmp_path: Path) -> None:
    report = tmp_path / "report"
    start = time.monotonic()
    done = vmtests(
        tmp_path, "run", "--profile", "cfx-llm2", "--target", "qemu:reference",
        "--deadline", "60", "--report-dir", str(report), timeout=300,
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == ExitStatus.INCOMPLETE, done.stderr[-2000:]
    # The run stops its step at the deadline, then collects the evidence for the person, which
    # is bounded on its own (EVIDENCE_TIMEOUT) and takes as long as the guest needs to answer
    # (a guest still starting dockerd answers `docker inspect` only once it is up).
    steps = json.loads((report / "report.json").read_text())["steps"]
    evidence = steps["evidence interrupted"]
    assert evidence < EVIDENCE_TIMEOUT, steps
    assert took - evidence < 90, f"{took:.0f}s in all, {evidence:.0f}s of it the evidence: {steps}"
    (line,) = [line for line in done.stderr.splitlines() if "deadline of 60s passed" in line]
    assert "during step " in line
    assert (report / "report.json").exists()
    assert qemus_under(tmp_path) == []
    assert not list(tmp_path.glob("vmtests-run-*"))
