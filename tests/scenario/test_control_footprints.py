"""Every negative control declares what its mechanism leaves on the guest, without a VM: each
mechanism runs against a machine that only records what it is asked to write and run, and
whatever it leaves beyond the target's own install (files, masked and transient units, manager
variables, stub knobs, processes' pid files) must be in the control's footprint, which the reset
takes away (``EVERY_FOOTPRINT``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import pytest

from vmtests.contracts.serving import SERVING_UNIT, Hugepages
from vmtests.driver.machine import CommandResult, Machine, render_command
from vmtests.guest import firewall
from vmtests.profiles import load_profile
from vmtests.scenario.controls.catalogue import CONTROLS, EVERY_FOOTPRINT, RM_F
from vmtests.scenario.controls.control import Control, Footprint
from vmtests.scenario.controls.reset import reset_command
from vmtests.scenario.install.reference_switch import UNIT_DIR, ReferenceSwitch, ServingConfig
from vmtests.scenario.install.serving_unit import STORE_DIR
from vmtests.stub import knobs

TARGET = ServingConfig(
    args=("--model", "/models/qwen36", "--port", "8000", "--enable-prefix-caching"),
    environment={"QWEN36_SDPA_STREAMING": "1", "QWEN36_MERGE_BATCH_GUARD": "1"},
    banner="tenstorrent-serving-config: prefix-caching=on digest=sha256:00",
    hugepages=Hugepages(2, "1G"),
    stop_timeout=60,
    image_file=f"{STORE_DIR}/0123-vmtests-stub-vllm.tar",
)
BASE = ServingConfig(
    args=("--model", "/models/qwen36", "--port", "8000"),
    environment={},
    banner="tenstorrent-serving-config: prefix-caching=off digest=sha256:11",
    hugepages=None,
    stop_timeout=60,
    image_file=TARGET.image_file,
)
INSTALL_FILES = re.compile(
    rf"^({re.escape(STORE_DIR)}/|{re.escape(UNIT_DIR)}/[^/]+$|{re.escape(firewall.RULES_FILE)}$"
    r"|/sys/|/proc/)"
)
"""What installing the target writes itself: store files, unit files, the firewall's rules, and
the kernel's settings (the hugepage pool), which its units set again."""


@dataclass
class _Switch:
    """The reference switch as the mechanisms use it: the profile and its two configurations."""

    target: ServingConfig = TARGET
    base: ServingConfig = BASE
    profile: object = field(default_factory=lambda: load_profile("cfx-llm2"))


@dataclass
class _Recorder:
    """Stands in for the guest: records the files written and the commands run; every command
    succeeds with no output and every wait is over at once."""

    name: str = "recorder"
    files: dict[str, str] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)

    def write_file(self, path: str, text: str, timeout: float = 0) -> None:
        self.files[path] = text

    def write_files(self, files: Mapping[str, str], timeout: float = 0) -> None:
        self.files.update(files)

    def succeed(self, command: str, *args: object, timeout: float = 0) -> str:
        self.commands.append(render_command(command, args))
        return ""

    def execute(self, command: str, *args: object, timeout: float = 0) -> CommandResult:
        self.commands.append(render_command(command, args))
        return CommandResult(command, 0, b"", b"")

    def wait_until_succeeds(self, command: str, *args: object, timeout: float = 0) -> None:
        self.commands.append(render_command(command, args))

    def wait_for_unit(self, unit: str, timeout: float = 0) -> None:
        """The unit is active."""

    def wait_for_http_ok(self, port: int, path: str, timeout: float = 0, unit: str = "") -> None:
        """It answers."""


def left_behind(control: Control) -> Footprint:
    """What ``control``'s mechanism leaves on the (recording) guest beyond the target's install."""
    machine = _Recorder()
    control.apply(cast(Machine, machine), cast(ReferenceSwitch, _Switch()))
    words = [shlex.split(command) for command in machine.commands]
    knob_names = {
        line.split("=", 1)[0] for line in machine.files.get(knobs.KNOBS_FILE, "").splitlines()
    }
    written = {path for path in machine.files if path != knobs.KNOBS_FILE}
    # Shell redirections and moves create files too.
    for command in machine.commands:
        written |= set(re.findall(r"(?<![0-9&])> ?(/[^\s;]+)", command))
        written |= {
            f"{target}{source.rsplit('/', 1)[1]}"
            for source, target in re.findall(r"\bmv (/\S+) (/\S+/)(?:\s|$)", command)
        }
    pid_files = {path for path in written if path.endswith(".pid")}
    return Footprint(
        files=frozenset(path for path in written - pid_files if not INSTALL_FILES.match(path)),
        masked_units=frozenset(_after(words, ["systemctl", "mask"])),
        transient_units=frozenset(_after(words, ["systemd-run", "--unit"])),
        manager_variables=frozenset(
            name.split("=", 1)[0]
            for name in _after(words, ["systemctl", "set-environment"], all_=True)
        ),
        stub_knobs=frozenset(knob_names - {""}),
        pid_files=frozenset(pid_files),
    )


def _after(commands: list[list[str]], prefix: list[str], all_: bool = False) -> list[str]:
    """The word (or, with ``all_``, every word) after ``prefix`` in the commands that hold it."""
    found: list[str] = []
    for words in commands:
        for index in range(len(words) - len(prefix) + 1):
            if words[index : index + len(prefix)] == prefix:
                rest = [word for word in words[index + len(prefix) :] if word != ";"]
                found += rest if all_ else rest[:1]
    return [word.rstrip(";") for word in found if not word.startswith("-") and word != "2>&1"]


@pytest.mark.parametrize("control", CONTROLS, ids=[control.name for control in CONTROLS])
def test_the_footprint_holds_what_the_mechanism_leaves(control: Control) -> None:
    found = left_behind(control)
    assert found | control.footprint == control.footprint, (
        f"{control.name} leaves what its footprint lacks: {found}"
    )


def test_the_check_catches_an_undeclared_file() -> None:
    """The check itself: a mechanism that writes a drop-in its footprint lacks is reported."""
    drop_in = f"{UNIT_DIR}/{SERVING_UNIT}.d/60-undeclared.conf"

    def writes_a_drop_in(machine: Machine, switch: ReferenceSwitch) -> None:
        machine.write_file(drop_in, "[Service]\nNice=5\n")

    control = Control(
        name="undeclared", mechanism="m", finds=None, apply=writes_a_drop_in, effect=lambda s: None
    )
    assert left_behind(control).files == {drop_in}
    assert not control.footprint.files


def test_the_reset_command_takes_every_footprint_away() -> None:
    command = reset_command(EVERY_FOOTPRINT, 60)
    for path in EVERY_FOOTPRINT.files | EVERY_FOOTPRINT.pid_files:
        assert shlex.quote(path) in command, path
    for name in EVERY_FOOTPRINT.manager_variables | EVERY_FOOTPRINT.masked_units:
        assert name in command, name
    assert "docker rm -f" not in command  # containers stop gracefully (RM_F's footprint)
    assert f"docker stop -t 60 {next(iter(RM_F.footprint.containers))}" in command
