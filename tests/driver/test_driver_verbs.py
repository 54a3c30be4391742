"""The nixpkgs driver's verbs (``vmtests.driver.verbs``) on the reference guest: each does what
it says, and each wait that cannot end says what it awaited and what it saw last."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vmtests.driver.errors import DriverError, RequestedAssertionFailed, WaitTimeout
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.shell import POWEROFF_COMMAND
from vmtests.guest.image import SETTLED

pytestmark = pytest.mark.vm

SCRATCH = "/tmp/vmt-verbs"
LISTENER_UNIT = "vmt-verbs-listener.service"
SOCKETS_UNIT = "vmt-verbs-sockets.service"
LISTENER_PORT = 18123
STREAM_SOCKET = "/run/vmt-verbs-stream.sock"
DATAGRAM_SOCKET = "/run/vmt-verbs-datagram.sock"
# One stream socket listening and one datagram socket bound, kept open until stopped.
SOCKETS_PROGRAM = (
    "import socket, time\n"
    "stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    f"stream.bind({STREAM_SOCKET!r}); stream.listen()\n"
    "datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    f"datagram.bind({DATAGRAM_SOCKET!r})\n"
    "time.sleep(600)\n"
)
PLAIN_UNIT = "vmt-verbs-plain.service"
PLAIN_UNIT_TEXT = """[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
"""


@pytest.fixture
def guest(shared_guest: QemuMachine) -> Iterator[QemuMachine]:
    """The shared guest with an empty scratch directory; the transient units a test started
    are stopped after (no ``daemon-reload``: it costs seconds under TCG)."""
    shared_guest.succeed("rm -rf %s && mkdir -p %s", SCRATCH, SCRATCH)
    yield shared_guest
    shared_guest.succeed(
        "systemctl stop %s %s 2>/dev/null; rm -rf %s %s %s; true",
        LISTENER_UNIT,
        SOCKETS_UNIT,
        SCRATCH,
        STREAM_SOCKET,
        DATAGRAM_SOCKET,
    )


# ---- wait_until_fails --------------------------------------------------------------------------


def test_wait_until_fails_retries_until_the_command_fails(guest: QemuMachine) -> None:
    counter = f"{SCRATCH}/count"
    guest.succeed("echo 0 > %s", counter)
    # Exits 0 on the first two runs and 1 on the third.
    result = guest.wait_until_fails(
        'n=$(cat %s); echo $((n + 1)) > %s; echo "run $((n + 1))"; [ "$n" -lt 2 ]',
        counter,
        counter,
        timeout=120,
    )
    assert result.rc == 1
    assert result.stdout_text.strip() == "run 3"
    assert guest.succeed("cat %s", counter).strip() == "3"


def test_wait_until_fails_times_out_with_the_last_output(guest: QemuMachine) -> None:
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_until_fails("echo still-fine", timeout=2)
    assert "'echo still-fine' to fail" in str(caught.value)
    assert "rc=0" in caught.value.last_seen
    assert "still-fine" in caught.value.last_seen


# ---- wait_for_file -----------------------------------------------------------------------------


def test_wait_for_file_waits_until_the_file_appears(guest: QemuMachine) -> None:
    path = f"{SCRATCH}/appears"
    # Guest commands have only the tool manifest's programs (no touch): the shell creates it.
    # A transient timer's default AccuracySec is a minute: ask for its elapse to the 0.1 s.
    guest.succeed(
        "systemd-run --quiet --on-active=3 --timer-property=AccuracySec=100ms /bin/sh -c %s",
        f": > {path}",
    )
    assert guest.execute("test -e %s", path).rc != 0  # not there yet: the wait has to wait
    guest.wait_for_file(path, timeout=120)
    assert guest.execute("test -e %s", path).rc == 0


def test_wait_for_file_times_out_showing_the_directory(guest: QemuMachine) -> None:
    guest.succeed(": > %s/neighbour", SCRATCH)
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_for_file(f"{SCRATCH}/never", timeout=2)
    assert f"file {SCRATCH}/never to exist" in str(caught.value)
    assert "neighbour" in caught.value.last_seen


# ---- ports and sockets -------------------------------------------------------------------------


def test_wait_for_closed_port_after_the_listener_stops(guest: QemuMachine) -> None:
    guest.succeed(
        "systemd-run --quiet --unit=%s python3 -m http.server %s --bind 127.0.0.1",
        LISTENER_UNIT,
        LISTENER_PORT,
    )
    guest.wait_for_open_port(LISTENER_PORT, timeout=120)
    stopped = guest.stop_job(LISTENER_UNIT)
    assert stopped.rc == 0, stopped.stderr_text
    guest.wait_for_closed_port(LISTENER_PORT, timeout=60)
    assert guest.execute("exec 3<>/dev/tcp/127.0.0.1/%s", LISTENER_PORT).rc != 0


def test_wait_for_closed_port_times_out_on_a_listening_port(guest: QemuMachine) -> None:
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_for_closed_port(22, timeout=2)
    assert "port 127.0.0.1:22 to stop accepting connections" in str(caught.value)
    assert ":22" in caught.value.last_seen


def test_wait_for_open_unix_socket_tells_stream_from_datagram(guest: QemuMachine) -> None:
    guest.succeed("systemd-run --quiet --unit=%s python3 -c %s", SOCKETS_UNIT, SOCKETS_PROGRAM)
    guest.wait_for_open_unix_socket(STREAM_SOCKET, timeout=120)
    guest.wait_for_open_unix_socket(DATAGRAM_SOCKET, is_datagram=True, timeout=30)
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_for_open_unix_socket(DATAGRAM_SOCKET, timeout=2)
    assert f"a u_str UNIX socket bound at {DATAGRAM_SOCKET}" in str(caught.value)
    assert "u_dgr" in caught.value.last_seen  # what is bound there instead


def test_wait_for_open_unix_socket_ignores_a_plain_file(guest: QemuMachine) -> None:
    path = f"{SCRATCH}/not-a-socket"
    guest.succeed(": > %s", path)
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_for_open_unix_socket(path, timeout=2)
    assert f"no listening UNIX socket at {path}" in caught.value.last_seen


# ---- systemd -----------------------------------------------------------------------------------


def test_systemctl_runs_the_query_with_quoted_arguments(guest: QemuMachine) -> None:
    result = guest.systemctl("is-active %s", "ssh.service")
    assert (result.rc, result.stdout_text.strip()) == (0, "active")
    missing = guest.systemctl("is-active %s", "vmt-no-such-unit.service")
    assert missing.rc != 0


def test_get_unit_info_and_property(guest: QemuMachine) -> None:
    info = guest.get_unit_info("ssh.service")
    assert info["Id"] == "ssh.service"
    assert info["ActiveState"] == "active"
    assert info["MainPID"].isdigit()
    assert int(info["MainPID"]) > 1
    assert guest.get_unit_property("ssh.service", "ActiveState") == "active"
    assert guest.get_unit_property("ssh.service", "MainPID") == info["MainPID"]


def test_get_unit_property_of_an_unknown_property_is_a_failed_assertion(
    guest: QemuMachine,
) -> None:
    with pytest.raises(RequestedAssertionFailed) as caught:
        guest.get_unit_property("ssh.service", "NoSuchProperty")
    assert "NoSuchProperty" in str(caught.value)


def test_start_stop_job_and_require_unit_state(guest: QemuMachine) -> None:
    unit_file = f"/run/systemd/system/{PLAIN_UNIT}"
    guest.write_file(unit_file, PLAIN_UNIT_TEXT)
    guest.succeed("systemctl daemon-reload")
    try:
        guest.require_unit_state(PLAIN_UNIT, "inactive")
        started = guest.start_job(PLAIN_UNIT)
        assert started.rc == 0, started.stderr_text
        guest.require_unit_state(PLAIN_UNIT)
        stopped = guest.stop_job(PLAIN_UNIT)
        assert stopped.rc == 0, stopped.stderr_text
        guest.require_unit_state(PLAIN_UNIT, "inactive")
    finally:
        guest.succeed("systemctl stop %s; rm -f %s; systemctl daemon-reload", PLAIN_UNIT, unit_file)


def test_require_unit_state_fails_as_an_assertion_with_diagnostics(guest: QemuMachine) -> None:
    with pytest.raises(RequestedAssertionFailed) as caught:
        guest.require_unit_state("ssh.service", "inactive")
    assert isinstance(caught.value, AssertionError)
    assert not isinstance(caught.value, DriverError)  # a state check, not a broken run
    message = str(caught.value)
    assert "unit ssh.service is in state 'active', expected 'inactive'" in message
    assert "--- systemctl status ssh.service ---" in message


# ---- files -------------------------------------------------------------------------------------


def test_copy_from_host_and_back_from_the_machine(guest: QemuMachine, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    (source / "sub").mkdir(parents=True)
    (source / "top.txt").write_text("top\n")
    (source / "sub" / "deep.bin").write_bytes(bytes(range(256)))
    guest.copy_from_host(source, f"{SCRATCH}/tree")
    guest.copy_from_host(str(source / "top.txt"), f"{SCRATCH}/single/top.txt")
    assert guest.succeed("cat %s/single/top.txt", SCRATCH) == "top\n"
    back = guest.copy_from_machine(f"{SCRATCH}/tree", tmp_path / "back")
    assert back == tmp_path / "back" / "tree"
    assert (back / "top.txt").read_text() == "top\n"
    assert (back / "sub" / "deep.bin").read_bytes() == bytes(range(256))


# ---- QEMU only: monitor and shutdown -----------------------------------------------------------


def test_send_monitor_command_returns_the_monitors_answer(guest: QemuMachine) -> None:
    assert "VM status: running" in guest.send_monitor_command("info status")
    assert "unknown command" in guest.send_monitor_command("vmt-no-such-command").lower()


def test_wait_for_shutdown_times_out_on_a_running_guest(guest: QemuMachine) -> None:
    with pytest.raises(WaitTimeout) as caught:
        guest.wait_for_shutdown(timeout=1)
    assert "to power off (QEMU to exit)" in str(caught.value)
    assert guest.process_running
    assert guest.succeed("echo still-here").strip() == "still-here"


def test_wait_for_shutdown_follows_a_poweroff_from_inside(
    reference_guest: Callable[..., QemuMachine],
) -> None:
    machine = reference_guest(name="poweroff", preparation=SETTLED)
    machine.succeed(POWEROFF_COMMAND)  # returns before systemd stops the backdoor
    machine.wait_for_shutdown(timeout=180)
    assert not machine.process_running
    with pytest.raises(DriverError):  # released: no command reaches a guest that is gone
        machine.execute("true")
