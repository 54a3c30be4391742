"""Command framing over the backdoor: exit codes, separate streams, binary, 1 MiB, timeouts."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from vmtests.driver.errors import CommandFailed, WaitTimeout
from vmtests.driver.qemu import QemuMachine

pytestmark = pytest.mark.vm


@pytest.mark.parametrize("code", [0, 1, 127, 255])
def test_exit_codes_come_back_exactly(shared_guest: QemuMachine, code: int) -> None:
    result = shared_guest.execute(f"echo out-{code}; echo err-{code} >&2; exit {code}")
    assert result.rc == code
    assert result.stdout == f"out-{code}\n".encode()
    assert result.stderr == f"err-{code}\n".encode()


def test_missing_command_is_127_with_its_stderr(shared_guest: QemuMachine) -> None:
    result = shared_guest.execute("vmtests-no-such-command --flag")
    assert result.rc == 127
    assert result.stdout == b""
    assert b"vmtests-no-such-command" in result.stderr


def test_binary_output_survives(shared_guest: QemuMachine) -> None:
    every_byte = bytes(range(256)) * 4
    shared_guest.succeed("printf '" + "".join(f"\\{b:03o}" for b in range(256)) + "' > /tmp/b")
    result = shared_guest.execute("cat /tmp/b /tmp/b /tmp/b /tmp/b; cat /tmp/b >&2")
    assert result.stdout == every_byte
    assert result.stderr == bytes(range(256))


def test_one_mebibyte_of_random_output_is_intact(shared_guest: QemuMachine) -> None:
    # The guest hashes what it sends; any byte lost or changed on the way shows up here.
    result = shared_guest.execute(
        "head -c 1048576 /dev/urandom > /tmp/mib; sha256sum < /tmp/mib | cut -d' ' -f1 >&2;"
        " cat /tmp/mib"
    )
    assert result.rc == 0
    assert len(result.stdout) == 1048576
    assert hashlib.sha256(result.stdout).hexdigest() == result.stderr.decode().strip()


def test_quoting_multiline_and_special_characters(shared_guest: QemuMachine) -> None:
    script = (
        'a=\'it\'"\'"\'s\'; b="$a \\$HOME"\nprintf \'%s|%s\\n\' "$a" "$b"\necho `echo ok` $((6*7))'
    )
    assert shared_guest.succeed(script) == "it's|it's $HOME\nok 42\n"


def test_command_timeout_kills_the_command_and_keeps_the_shell(shared_guest: QemuMachine) -> None:
    with pytest.raises(WaitTimeout) as caught:
        shared_guest.execute("echo started; sleep 313; echo never", timeout=2)
    assert "sleep 313" in str(caught.value)
    assert "started" in str(caught.value)  # the partial output is part of the evidence
    assert shared_guest.succeed("echo usable") == "usable\n"
    assert shared_guest.execute("pgrep -f '^sleep 313$'").rc == 1  # killed in the guest


def test_succeed_and_fail_raise_with_command_rc_and_streams(shared_guest: QemuMachine) -> None:
    with pytest.raises(CommandFailed) as caught:
        shared_guest.succeed("echo visible-out; echo visible-err >&2; exit 3")
    assert caught.value.result.rc == 3
    message = str(caught.value)
    assert "rc=3" in message
    assert "visible-out" in message
    assert "visible-err" in message
    with pytest.raises(CommandFailed):
        shared_guest.fail("true")
    assert "nope" in shared_guest.fail("echo nope >&2; false")


def test_copy_to_and_back_preserves_files(shared_guest: QemuMachine, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    (source / "sub").mkdir(parents=True)
    payload = os.urandom(300_000)
    (source / "sub" / "blob.bin").write_bytes(payload)
    (source / "script.sh").write_text("#!/bin/sh\necho hi\n")
    (source / "script.sh").chmod(0o755)
    shared_guest.copy_to(source, "/root/copied")
    assert shared_guest.succeed("/root/copied/script.sh") == "hi\n"
    digest = shared_guest.succeed("sha256sum /root/copied/sub/blob.bin").split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()
    back = tmp_path / "back"
    shared_guest.copy_from("/root/copied", back)
    assert (back / "sub" / "blob.bin").read_bytes() == payload
    assert os.access(back / "script.sh", os.X_OK)
