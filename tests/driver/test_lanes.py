"""Jobs run in lanes (``vmtests selftest``'s guests side by side): results in the jobs' order,
the guests' TCG thread mode chosen for the guests at once, and on a failure or Ctrl-C every
child process killed, and none started, before the error is raised."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from vmtests.driver import procs, qemu_launch
from vmtests.driver.lanes import run_in_lanes


def test_results_come_in_the_jobs_order_and_lanes_overlap() -> None:
    running: list[int] = []
    most = [0]
    lock = threading.Lock()

    def job(number: int, seconds: float) -> int:
        with lock:
            running.append(number)
            most[0] = max(most[0], len(running))
        time.sleep(seconds)
        with lock:
            running.remove(number)
        return number

    jobs = [lambda n=n, s=s: job(n, s) for n, s in enumerate([0.3, 0.05, 0.05, 0.1])]
    assert run_in_lanes(jobs, 2) == [0, 1, 2, 3]
    assert most[0] == 2
    assert run_in_lanes(jobs, 1) == [0, 1, 2, 3]


def test_guests_in_lanes_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    seen = run_in_lanes([lambda: qemu_launch.host_tcg_thread_mode(2)] * 2, 2)
    assert seen == ["single", "single"]  # two 2-vCPU guests on two cores
    assert qemu_launch.host_tcg_thread_mode(2) == "multi"  # one guest alone again


def test_a_failing_lane_kills_every_child_and_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    killed = threading.Event()
    monkeypatch.setattr(procs, "kill_all", killed.set)

    def fails() -> None:
        raise RuntimeError("a guest broke")

    def waits_for_the_kill() -> None:
        assert killed.wait(10), "the other lane was never stopped"

    with pytest.raises(RuntimeError, match="a guest broke"):
        run_in_lanes([waits_for_the_kill, fails], 2)
    assert killed.is_set()
    procs.reap(procs.spawn(["true"], "a child after the lanes ended"))  # allowed again


LANES_CHILD = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores it
    from vmtests.driver import procs
    from vmtests.driver.lanes import run_in_lanes

    def guest_after_guest():
        # Like a lane that starts a guest for each control: when its guest dies, the next.
        for _ in range(3):
            child = procs.spawn([sys.executable, "-c", "import time; time.sleep(300)"], "guest")
            print(child.pid, flush=True)
            child.wait()

    run_in_lanes([guest_after_guest] * 3, 2)
    """
)


def test_ctrl_c_leaves_no_lane_running_and_starts_nothing(tmp_path: Path) -> None:
    """Real children in real lanes: after Ctrl-C the lanes end at once, every child they
    started is gone, and no lane starts another (each would on its child's death)."""
    script = tmp_path / "lanes.py"
    script.write_text(LANES_CHILD)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        pids = [int(child.stdout.readline()) for _ in range(2)]  # both lanes have a child
        child.send_signal(signal.SIGINT)
        output, errors = child.communicate(timeout=30)
    finally:
        procs.kill_group(child.pid)
        child.kill()
    assert "KeyboardInterrupt" in errors, errors
    pids += [int(line) for line in output.split()]
    assert len(pids) == 2, f"a lane started another child after Ctrl-C: {pids}"
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
