"""``--keep``, ``attach``, ``stop`` and ``--deadline`` without a guest: the arguments, the
state file, the keeper's rules (with ``sleep`` as its QEMU) and the deadline's timer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from vmtests import cli
from vmtests.contracts import deadline
from vmtests.contracts.status import ExitStatus
from vmtests.driver import keep, keep_run, procs
from vmtests.driver.errors import DriverError


def _state(tmp_path: Path, **changes: object) -> keep.KeptState:
    fields: dict[str, object] = {
        "name": "g", "target": "qemu:reference", "keeper_pid": 1, "keeper_start": "1",
        "qemu_pid": 2, "qemu_start": "2", "qmp_socket": str(tmp_path / "q"),
        "forwards": {"22": 2222}, "ssh_port": 2222, "ssh_key": "/k", "known_hosts": None,
        "keep_for": 60.0, "until": 0.0, "remove": [],
    }  # fmt: skip
    return keep.KeptState(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["check", "run", "selftest", "certify"])
def test_every_running_command_takes_keep_keep_for_and_deadline(command: str) -> None:
    profile = [] if command == "selftest" else ["--profile", "baseline"]
    args = cli.build_parser().parse_args([command, *profile])
    assert (args.keep, args.keep_for, args.deadline) == (
        False, keep.DEFAULT_KEEP_FOR, deadline.DEFAULT_DEADLINE,
    )  # fmt: skip
    args = cli.build_parser().parse_args(
        [command, *profile, "--keep", "--keep-for", "30", "--deadline", "60"]
    )
    assert (args.keep, args.keep_for, args.deadline) == (True, 30.0, 60.0)


def test_attach_takes_a_state_and_a_command_after_the_double_dash() -> None:
    args = cli.build_parser().parse_args(["attach", "/s", "--", "systemctl", "is-system-running"])
    assert args.state == Path("/s")
    assert args.remote[-2:] == ["systemctl", "is-system-running"]
    assert cli.build_parser().parse_args(["stop", "/s"]).state == Path("/s")


def test_the_state_file_round_trips_and_is_private(tmp_path: Path) -> None:
    state = _state(tmp_path, remove=[str(tmp_path / "x")])
    path = keep.write_state(tmp_path / keep.STATE_FILE, state)
    assert path.stat().st_mode & 0o777 == 0o600
    assert keep.read_state(tmp_path) == state  # the directory names its state file
    assert keep.read_state(path) == state
    (tmp_path / keep.STATE_FILE).write_text("{}")
    with pytest.raises(DriverError, match="not the state of a kept guest"):
        keep.read_state(tmp_path)


def test_attach_runs_one_word_as_a_command_line_and_quotes_several(tmp_path: Path) -> None:
    state = _state(tmp_path, known_hosts="/kh")
    shell = keep.attach_argv(state)
    assert shell[-2:] == ["-t", "root@127.0.0.1"]
    assert shell[1:3] == ["-p", "2222"]
    assert "UserKnownHostsFile=/kh" in shell
    assert "StrictHostKeyChecking=yes" in shell
    assert keep.attach_argv(state, ["journalctl | tail"])[-1] == "journalctl | tail"
    assert keep.attach_argv(state, ["sh", "-c", "exit 7"])[-1] == "sh -c 'exit 7'"


def _keeps_while_handling(error: BaseException, failed: bool) -> bool:
    """``should_keep(True, failed)`` asked in the ``except`` block of ``error``."""

    def fail() -> None:
        raise error

    try:
        fail()
    except BaseException:  # what should_keep reads from sys.exc_info
        return keep_run.should_keep(True, failed)
    return False


def test_only_a_failed_run_or_a_passed_deadline_keeps_not_ctrl_c() -> None:
    assert not keep_run.should_keep(False, True)
    assert not keep_run.should_keep(True, False)
    assert keep_run.should_keep(True, True)
    assert not _keeps_while_handling(KeyboardInterrupt(), True)
    assert _keeps_while_handling(deadline.DeadlineExceeded(60, "reboot"), False)
    assert _keeps_while_handling(RuntimeError("broke"), False)


def test_the_keeper_kills_its_child_when_the_run_lets_go_without_keeping() -> None:
    keeper = keep.spawn_kept(["sleep", "60"], "keeper of sleep")
    try:
        child = keep.qemu_child(keeper.pid)
        assert keep.is_kept_process(keeper)
        assert keeper.stdin is not None
        keeper.stdin.close()  # the run ended (or was SIGKILLed) without a keep line
        keeper.wait(timeout=10)
        assert keep.start_time(child) == ""
    finally:
        procs.reap(keeper)


def test_a_kept_child_outlives_the_registry_and_its_end_removes_what_it_left(
    tmp_path: Path,
) -> None:
    left = tmp_path / "left"
    left.mkdir()
    keeper = keep.spawn_kept(["sleep", "2"], "keeper of sleep")
    try:
        child = keep.qemu_child(keeper.pid)
        state = _state(
            tmp_path, keeper_pid=keeper.pid, keeper_start=keep.start_time(keeper.pid),
            qemu_pid=child, qemu_start=keep.start_time(child), remove=[str(left)],
        )  # fmt: skip
        path = keep.write_state(left / keep.STATE_FILE, state)
        keep.hand_over(keeper, 600, path)
        assert not procs.registered(keeper.pid)  # the session's cleanup no longer reaches it
        assert keep.alive(child, state.qemu_start)
        keeper.wait(timeout=20)  # the child ended by itself: the keeper ends with it
        assert not left.exists()
    finally:
        procs.reap(keeper)


def test_the_keeper_refuses_a_command_line_without_its_separator() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vmtests.driver.keeper", "sleep", "1"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "usage" in done.stderr


def test_stop_of_an_ended_guest_removes_what_it_left(tmp_path: Path) -> None:
    left = tmp_path / "left"
    left.mkdir()
    state = _state(tmp_path, qemu_start="", keeper_start="", remove=[str(left)])
    said = keep.stop_kept(state)
    assert said[0] == "QEMU had already ended"
    assert not left.exists()


def test_the_deadline_raises_once_naming_the_step() -> None:
    def slow_reboot() -> None:
        with deadline.run_deadline(0.2):
            deadline.entered("reboot")
            time.sleep(5)

    with pytest.raises(deadline.DeadlineExceeded) as raised:
        slow_reboot()
    assert raised.value.step == "reboot"
    assert str(raised.value) == "the deadline of 0.2s passed during step reboot"
    assert deadline.passed() is raised.value


def test_no_deadline_with_zero_seconds() -> None:
    with deadline.run_deadline(0):
        time.sleep(0.1)
    assert deadline.passed() is None


def test_the_cli_exits_3_naming_the_step_when_the_deadline_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def slow(_args: object) -> int:
        deadline.entered("snapshot S1")
        time.sleep(10)
        return 0

    monkeypatch.setattr(cli, "command_check", slow)
    status = cli.main(["check", "--profile", "baseline", "--deadline", "0.3"])
    assert status == ExitStatus.INCOMPLETE
    assert "deadline of 0.3s passed during step snapshot S1" in capsys.readouterr().err


def test_the_cli_exits_3_when_a_command_handled_the_deadline_and_finished(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def handles(_args: object) -> int:  # like certify: it catches the interrupt, then reports
        deadline.entered("gate concurrency")
        try:
            time.sleep(10)
        except KeyboardInterrupt:
            return ExitStatus.FAILED
        return 0

    monkeypatch.setattr(cli, "command_check", handles)
    status = cli.main(["check", "--profile", "baseline", "--deadline", "0.3"])
    assert status == ExitStatus.INCOMPLETE
    assert "during step gate concurrency" in capsys.readouterr().err
