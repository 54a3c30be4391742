"""A missing external program is a clear error that names its Debian package."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmtests.driver.ssh import SshMachine
from vmtests.driver.tools import MissingTool, require_tools


def test_missing_programs_are_named_with_their_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingTool) as raised:
        require_tools("qemu-img", "mmdebstrap")
    message = str(raised.value)
    assert "qemu-img (apt-get install qemu-utils)" in message
    assert "mmdebstrap (apt-get install mmdebstrap)" in message


def test_present_programs_pass_and_only_the_missing_ones_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "qemu-img").write_text("#!/bin/sh\n")
    (tmp_path / "qemu-img").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    require_tools("qemu-img")  # present: no error
    with pytest.raises(MissingTool) as raised:
        require_tools("qemu-img", "mmdebstrap")
    assert "qemu-img" not in str(raised.value)
    assert "mmdebstrap (apt-get install mmdebstrap)" in str(raised.value)


def test_ssh_backend_refuses_to_start_without_ssh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    machine = SshMachine("127.0.0.1", 22, known_hosts=tmp_path / "known_hosts")
    with pytest.raises(MissingTool, match=r"ssh \(apt-get install openssh-client\)"):
        machine.start()
