"""Generations and what a switch would do, from the nixpkgs tools' own output formats (no
machine needed); the reference guest's unit-set rollback runs in test_first_run_vm.py."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from vmtests.contracts.settings import Settings
from vmtests.driver.errors import DriverError, MachineGone
from vmtests.driver.machine import CommandResult, Machine
from vmtests.scenario.install.generations import (
    Generation,
    command_action,
    current_generation,
    nixos_dry_run,
    restarts_in,
)
from vmtests.scenario.runner.recovery import (
    SWITCH_PROCESSES,
    Action,
    OnFailure,
    Recovery,
    recover,
    rollback_command,
)

# switch-to-configuration-ng's dry-activate lines (src/main.rs), on stderr, as nixos-rebuild
# passes them on: a changed service with stopIfChanged is stopped and started.
DRY_ACTIVATE = """building the system configuration...
would stop the following units: docker-foo.service, tenstorrent-serving.service
would NOT stop the following changed units: vmtests-backdoor.service
would activate the configuration...
would restart the following units: systemd-journald.service
would start the following units: docker-foo.service, tenstorrent-serving.service
"""


def test_the_switch_action_is_swapped_for_the_dry_ones() -> None:
    command = "nixos-rebuild switch --flake '/etc/nixos#cfx-llm2' --max-jobs 0"
    assert command_action(command, "nixos-rebuild", "dry-build") == (
        "nixos-rebuild dry-build --flake '/etc/nixos#cfx-llm2' --max-jobs 0"
    )
    assert command_action("sudo /run/current-system/sw/bin/nixos-rebuild switch", "nixos-rebuild",
                          "dry-activate") == (
        "sudo /run/current-system/sw/bin/nixos-rebuild dry-activate"
    )  # fmt: skip
    stc = "/nix/store/abc-nixos-system-x/bin/switch-to-configuration switch"
    assert command_action(stc, "switch-to-configuration", "dry-activate") == (
        "/nix/store/abc-nixos-system-x/bin/switch-to-configuration dry-activate"
    )
    assert command_action("nixos-rebuild boot", "nixos-rebuild", "dry-build") is None
    redirected = "nixos-rebuild switch --flake '.#a' 2>&1"
    assert command_action(redirected, "nixos-rebuild", "dry-build") == (
        "nixos-rebuild dry-build --flake '.#a' 2>&1"
    )


def test_only_the_simple_command_that_switches_is_dry_run() -> None:
    """A compound switch (set the profile, then activate): the dry action is the activation
    alone, never the ``nix-env --set`` before it, nor ``&&`` passed on as a word."""
    toplevel = "/nix/store/abc-nixos-system-x"
    compound = (
        f"nix-env -p /nix/var/nix/profiles/system --set {toplevel} && "
        f"{toplevel}/bin/switch-to-configuration switch"
    )
    assert command_action(compound, "switch-to-configuration", "dry-activate") == (
        f"{toplevel}/bin/switch-to-configuration dry-activate"
    )
    assert command_action(f"true; {compound} || exit 1", "nix-env", "dry-activate") is None
    assert command_action("a | nixos-rebuild switch; b", "nixos-rebuild", "dry-build") == (
        "nixos-rebuild dry-build"
    )
    assert command_action("my-deploy cfx-llm2", "nixos-rebuild", "dry-build") is None


def test_restarts_are_read_from_stop_and_start_or_restart() -> None:
    assert restarts_in(DRY_ACTIVATE)
    assert restarts_in(DRY_ACTIVATE, "systemd-journald.service")
    assert not restarts_in(DRY_ACTIVATE, "vmtests-backdoor.service")
    assert not restarts_in("would activate the configuration...\n")


class _Answers:
    """A machine answering each command by the first key it contains."""

    name = "cfx-llm2"

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def execute(self, command: str, *args: object, timeout: float) -> CommandResult:
        self.commands.append(command)
        rc, out = next(value for key, value in self.answers.items() if key in command)
        return CommandResult(command, rc, out.encode(), b"")

    def succeed(self, command: str, *args: object, timeout: float) -> str:
        result = self.execute(command, timeout=timeout)
        if result.rc != 0:
            raise DriverError(f"{command} failed")
        return result.stdout_text


def test_a_nixos_dry_run_refuses_what_does_not_evaluate_and_sees_no_restart() -> None:
    command = "nixos-rebuild switch --flake /etc/nixos#cfx-llm2"
    broken = _Answers({"dry-build": (1, "error: attribute 'cfx-llm2' missing")})
    dry = nixos_dry_run(cast(Machine, broken), command, 60)
    assert (dry.evaluates, dry.restarts) == (False, None)
    assert "error: attribute 'cfx-llm2' missing" in dry.detail
    same = _Answers(
        {"dry-build": (0, ""), "dry-activate": (0, "would activate the configuration...\n")}
    )
    dry = nixos_dry_run(cast(Machine, same), command, 60)
    assert (dry.evaluates, dry.restarts) == (True, False)
    changed = _Answers({"dry-build": (0, ""), "dry-activate": (0, DRY_ACTIVATE)})
    assert nixos_dry_run(cast(Machine, changed), command, 60).restarts is True
    unknown = nixos_dry_run(cast(Machine, changed), "deploy-rs .#cfx-llm2", 60)
    assert (unknown.evaluates, unknown.restarts) == (None, None)


STORE = "/nix/store/0123abcd-nixos-system-cfx-llm2-26.11"
POOL = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"


def test_the_nixos_generation_and_its_exact_way_back() -> None:
    store, pool = STORE, POOL
    answers = {
        "readlink": (0, f"{store}\nsystem-41-link\n{store}\n"),
        "nr_hugepages": (0, "1048576kB 0\n"),
    }
    machine = cast(Machine, _Answers(answers))
    generation = current_generation(machine)
    assert generation.id == store
    # The pools go back too: the target's oneshot reserved its pages at runtime.
    # The activation runs in a unit of its own, as nixos-rebuild-ng runs it (nix.py,
    # SWITCH_TO_CONFIGURATION_CMD_PREFIX): a dropped ssh connection cannot end it halfway.
    assert generation.rollback_command == (
        "nix-env -p /nix/var/nix/profiles/system --switch-generation 41 && { "
        "systemd-run -E LOCALE_ARCHIVE -E NIXOS_INSTALL_BOOTLOADER=0 -E NIXOS_NO_CHECK --collect "
        "--no-ask-password --pipe --quiet --service-type=exec "
        "--unit=vmtests-switch-to-configuration "
        "/nix/var/nix/profiles/system/bin/switch-to-configuration switch; rc=$?; "
        f'{{ read n < {pool} && [ "$n" -gt 0 ] && echo 0 > {pool}; echo 0 > {pool}; }}; '
        "(exit $rc); }"
    )
    assert "generation 41" in generation.description
    assert "hugepage pools 1048576 KiB: 0" in generation.description
    assert rollback_command(generation, "nixos-rebuild switch --store-path {generation}") == (
        f"nixos-rebuild switch --store-path {store}"
    )
    left = recover(
        machine, generation, on_failure=OnFailure.LEAVE, command=None, settings=Settings()
    )
    assert left.action == Action.LEFT
    assert generation.rollback_command in left.message
    debian = cast(Machine, _Answers({"readlink": (1, "")}))
    with pytest.raises(DriverError, match="not a NixOS host"):
        current_generation(debian)


class _Host(_Answers):
    """A NixOS host after a failed run, answering as ``_Answers`` does; ``dropped`` makes the
    first command find the ssh session gone, as a switch that restarted the network leaves it,
    until ``reconnect``; ``reboot_pending``: a Ctrl-C cut the wait for a reboot short;
    ``interrupted``: a Ctrl-C arrives during the command that contains it."""

    def __init__(
        self,
        answers: dict[str, tuple[int, str]],
        *,
        dropped: bool = False,
        reboot_pending: bool = False,
        interrupted: str | None = None,
    ) -> None:
        super().__init__(answers)
        self.dropped = dropped
        self.reboot_pending = reboot_pending
        self.interrupted = interrupted

    def reconnect(self, timeout: float | None = None) -> None:
        self.commands.append(f"<reconnect {timeout}>")
        self.dropped = self.reboot_pending = False

    def execute(self, command: str, *args: object, timeout: float) -> CommandResult:
        if self.dropped:
            raise MachineGone(f"{self.name}: not connected")
        if self.interrupted is not None and self.interrupted in command:
            self.commands.append(command)
            raise KeyboardInterrupt
        return super().execute(command, timeout=timeout)

    def wait_until_succeeds(self, command: str, *args: object, timeout: float) -> None:
        self.succeed(command, timeout=timeout)

    def wait_for_unit(self, unit: str, timeout: float) -> None:
        self.succeed(f"systemctl show -p ActiveState --value {unit}", timeout=timeout)

    def wait_for_http_ok(self, port: int, path: str, timeout: float, unit: str) -> None:
        self.succeed(f"curl http://127.0.0.1:{port}{path}", timeout=timeout)


OLD = "/nix/store/0123abcd-nixos-system-cfx-llm2-26.11"
NEW = "/nix/store/4567efgh-nixos-system-cfx-llm2-26.11"
OLD_GENERATION = Generation(OLD, f"{OLD} (generation 41)", "rollback-41", "readlink -f /run/x")
FAST = Settings(ready_timeout=1.0, switch_timeout=5.0)


def _rolled_back(host: _Host) -> Recovery:
    return recover(
        cast(Machine, host),
        OLD_GENERATION,
        on_failure=OnFailure.ROLLBACK,
        command=None,
        settings=FAST,
    )


def test_a_session_dropped_by_the_switch_is_reopened_and_the_switch_awaited() -> None:
    host = _Host(
        {"pgrep": (0, ""), "rollback-41": (0, ""), "readlink": (0, OLD), "ActiveState": (0,
         "active"), "curl": (0, ""), "true": (0, "")},
        dropped=True,
    )  # fmt: skip
    recovery = _rolled_back(host)
    assert recovery.action == Action.ROLLED_BACK, recovery.message
    steps = ("<reconnect None>", "pgrep", "rollback-41")  # within the machine's own timeout
    order = [step for command in host.commands for step in steps if step in command]
    assert order == list(steps)


HEALTHY_BACK = {"pgrep": (0, ""), "rollback-41": (0, ""), "readlink": (0, OLD),
                "ActiveState": (0, "active"), "curl": (0, ""), "true": (0, "")}  # fmt: skip


def test_a_ctrl_c_during_the_reboot_rolls_back_on_the_new_boot() -> None:
    """The old boot may still answer while it goes down, and a rollback begun there would die
    with it: the host is awaited first, as long as its reboot may take."""
    host = _Host(HEALTHY_BACK, reboot_pending=True)
    settings = replace(FAST, reboot_timeout=900.0)
    recovery = recover(
        cast(Machine, host), OLD_GENERATION, on_failure=OnFailure.ROLLBACK, command=None,
        settings=settings,
    )  # fmt: skip
    assert recovery.action == Action.ROLLED_BACK, recovery.message
    assert host.commands[0] == "<reconnect 900.0>", host.commands
    assert host.commands.index("rollback-41") > 0


def test_an_interrupted_rollback_says_it_may_still_run_and_how_to_see_it() -> None:
    host = _Host(HEALTHY_BACK, interrupted="rollback-41")
    recovery = _rolled_back(host)
    assert (recovery.action, recovery.verified) == (Action.FAILED, False)
    assert "was interrupted and may still be running on cfx-llm2" in recovery.message
    assert f"`{SWITCH_PROCESSES}` lists it until it ends" in recovery.message
    assert recovery.message.endswith("run as root on cfx-llm2: rollback-41")
    # Its generation is not asked: the session would wait for the rollback to end first.
    assert not any("readlink" in command for command in host.commands)
    # A Ctrl-C while the host is awaited (here: its reboot), before the rollback was sent.
    waiting = _Host(HEALTHY_BACK, interrupted="true")
    recovery = _rolled_back(waiting)
    assert "did not begin (a Ctrl-C stopped the wait for cfx-llm2 to answer)" in recovery.message
    assert "may still be running" not in recovery.message


def test_a_rollback_whose_server_is_still_starting_is_not_called_failed() -> None:
    host = _Host({"pgrep": (0, ""), "rollback-41": (0, ""), "readlink": (0, OLD),
                  "ActiveState": (1, "failed"), "true": (0, "")})  # fmt: skip
    recovery = _rolled_back(host)
    assert recovery.action == Action.NOT_SERVING
    assert recovery.verified
    assert f"runs the recorded generation {OLD} again" in recovery.message


def test_a_failed_rollback_says_which_generation_the_host_runs() -> None:
    host = _Host({"pgrep": (0, ""), "rollback-41": (1, "Could not acquire lock"),
                  "readlink": (0, NEW), "true": (0, "")})  # fmt: skip
    recovery = _rolled_back(host)
    assert recovery.action == Action.FAILED
    assert f"runs {NEW}, not the recorded {OLD}" in recovery.message
    assert recovery.message.endswith("rollback-41")
    left = recover(
        cast(Machine, host), OLD_GENERATION, on_failure=OnFailure.LEAVE, command=None, settings=FAST
    )
    assert f"runs {NEW}, not the recorded {OLD}" in left.message


def test_a_booted_generation_that_is_not_the_profiles_is_refused() -> None:
    """After booting an older generation, or `nixos-rebuild test`, the profile's generation is
    not what runs: going back to it would activate a system the host never ran."""
    older = "/nix/store/9876fedc-nixos-system-cfx-llm2-26.11"
    answers = {"readlink": (0, f"{older}\nsystem-41-link\n{STORE}\n"), "nr_hugepages": (0, "")}
    with pytest.raises(DriverError, match="would activate a system the host did not run"):
        current_generation(cast(Machine, _Answers(answers)))


def test_a_profile_that_is_no_generation_link_is_set_to_the_running_system() -> None:
    answers = {"readlink": (0, f"{STORE}\n{STORE}\n{STORE}\n"), "nr_hugepages": (0, "")}
    generation = current_generation(cast(Machine, _Answers(answers)))
    # The boot entry follows: the profile is set to the system, then it is activated.
    assert generation.rollback_command.startswith(
        f"nix-env -p /nix/var/nix/profiles/system --set {STORE} && {{ systemd-run "
    )
    assert f" {STORE}/bin/switch-to-configuration switch; rc=$?; true; (exit $rc); }}" in (
        generation.rollback_command
    )


@pytest.mark.parametrize(
    ("nix_env", "systemd_run", "status", "pages"),
    [
        (0, 4, 4, "2\n"),  # a unit failed to start: the system is switched, the pools go back
        (1, 0, 1, "4\n"),  # nix-env failed: nothing was activated, the pools stay
    ],
)
def test_the_pools_go_back_when_the_activation_ran(
    tmp_path: Path, nix_env: int, systemd_run: int, status: int, pages: str
) -> None:
    """switch-to-configuration exits 4 when a unit failed, with the system switched: the pools
    are set back all the same, and the rollback still fails with that status. When nix-env
    fails, nothing was activated and the pools are left to the system that runs. The command
    runs in a real shell, with nix-env and systemd-run stand-ins and the pool in a file."""
    answers = {
        "readlink": (0, f"{STORE}\nsystem-41-link\n{STORE}\n"),
        "nr_hugepages": (0, "1048576kB 2\n"),
    }
    generation = current_generation(cast(Machine, _Answers(answers)))
    bin_dir, pool = tmp_path / "bin", tmp_path / "nr_hugepages"
    bin_dir.mkdir()
    for tool, exit_status in {"nix-env": nix_env, "systemd-run": systemd_run}.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\nexit {exit_status}\n")
        (bin_dir / tool).chmod(0o755)
    pool.write_text("4\n")
    command = generation.rollback_command.replace(POOL, str(pool))
    ran = subprocess.run(
        ["sh", "-c", command],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        check=False,
    )
    assert ran.returncode == status
    assert pool.read_text() == pages


def test_the_pools_that_shrink_go_back_before_those_that_grow(tmp_path: Path) -> None:
    """A switch that moved pages from the 1 GiB pool to the 2 MiB one: going back, the 2 MiB
    pool gives its pages back before the 1 GiB pool asks for contiguous memory. Run in a real
    shell with ``-x``, whose trace shows the order of the writes."""
    small = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    answers = {
        "readlink": (0, f"{STORE}\nsystem-41-link\n{STORE}\n"),
        "nr_hugepages": (0, "1048576kB 2\n2048kB 0\n"),
    }
    generation = current_generation(cast(Machine, _Answers(answers)))
    bin_dir, big_file, small_file = tmp_path / "bin", tmp_path / "big", tmp_path / "small"
    bin_dir.mkdir()
    for tool in ("nix-env", "systemd-run"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    big_file.write_text("0\n")
    small_file.write_text("512\n")
    command = generation.rollback_command.replace(POOL, str(big_file))
    command = command.replace(small, str(small_file))
    ran = subprocess.run(
        ["sh", "-xc", command], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    writes = [line for line in ran.stderr.splitlines() if line.startswith("+ echo")]
    assert writes[0] == "+ echo 0", ran.stderr  # the 2 MiB pool, shrinking
    assert (big_file.read_text(), small_file.read_text()) == ("2\n", "0\n")


def test_a_rollback_that_leaves_other_pools_is_not_verified() -> None:
    answers = {
        "readlink": (0, f"{STORE}\nsystem-41-link\n{STORE}\n"),
        "nr_hugepages": (0, "1048576kB 0\n"),
    }
    generation = current_generation(cast(Machine, _Answers(answers)))
    # After the rollback: the system is the recorded one, but the pool still holds 2 pages.
    host = _Host({"pgrep": (0, ""), "nix-env": (0, ""), "readlink": (0, STORE),
                  "nr_hugepages": (0, "1048576kB 2\n"), "ActiveState": (0, "active"),
                  "curl": (0, ""), "true": (0, "")})  # fmt: skip
    back = recover(
        cast(Machine, host), generation, on_failure=OnFailure.ROLLBACK, command=None, settings=FAST
    )
    assert (back.action, back.verified) == (Action.FAILED, False)
    assert "hugepage pools are not the recorded ones (1048576 KiB: 2, not 0)" in back.message
    host.answers["nr_hugepages"] = (0, "1048576kB 0\n")
    back = recover(
        cast(Machine, host), generation, on_failure=OnFailure.ROLLBACK, command=None, settings=FAST
    )
    assert (back.action, back.verified) == (Action.ROLLED_BACK, True), back.message
