"""The QEMU backend: a guest driven over its virtio-port backdoor, ttyS0 console and QMP.

One ``QemuMachine`` is one guest with its own state directory (qcow2 overlay, console logs,
QEMU's stderr), its own free host ports and its own QEMU process, which never outlives the
session (``vmtests.driver.procs``). See ``qemu_launch`` for the command lines and
``vmtests.contracts.instrumentation`` for what the guest provides.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from vmtests.contracts.instrumentation import (
    BACKDOOR_READY_RE,
    GUEST_CPUS,
    GUEST_MEMORY_MB,
    SSH_PORT,
)
from vmtests.contracts.settings import ACCELERATORS, REBOOT_MODES, Settings, settings
from vmtests.driver import accel as accel_choice
from vmtests.driver import keep as keep_
from vmtests.driver import procs, qemu_launch, qemu_snapshot
from vmtests.driver.console import SerialConsole
from vmtests.driver.errors import CommandFailed, DriverError, MachineGone, WaitTimeout
from vmtests.driver.log import log
from vmtests.driver.machine import (
    DEFAULT_REBOOT_TIMEOUT,
    CommandResult,
    Machine,
)
from vmtests.driver.qemu_process import QemuProcess
from vmtests.driver.shell import REBOOT_COMMAND, ShellChannel
from vmtests.driver.ssh import write_known_hosts
from vmtests.driver.tools import require_tools

# qemu.qmp logs every refused connection attempt at ERROR; our errors carry the evidence.
logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)

DEFAULT_BOOT_TIMEOUT = 300.0
PORT_ATTEMPTS = 3
CONSOLE_SYNC_TIMEOUT = 10.0
PROBE_SLICE = 0.25
"""How often the KVM probe looks at QEMU's state while it waits for the kernel."""
STOPPED_STATES = ("internal-error", "guest-panicked", "shutdown", "io-error")
"""QMP run states in which a KVM guest will never print its first line."""
RESTART_LINE = "reboot: Restarting system"
"""What the kernel prints on the console (an emergency-level line) when it reboots."""


class QemuMachine(Machine):
    """A QEMU guest: the reference guest (direct boot) or a NixOS VM (its run script).

    A directly booted guest can get ``data_disks`` (serial -> file), attached read-only as
    virtio disks (``/dev/disk/by-id/virtio-<serial>`` in the guest), and can start from a
    saved guest (``restore_from``, ``vmtests.driver.qemu_snapshot``) instead of booting.
    """

    def __init__(
        self,
        name: str,
        state_dir: Path,
        *,
        kernel: Path | None = None,
        initrd: Path | None = None,
        append: str = "",
        base_disk: Path | None = None,
        run_script: Path | None = None,
        memory_mb: int | None = None,
        cpus: int | None = None,
        accel: str | None = None,
        forward_ports: Sequence[int] = (),
        ssh_key: Path | None = None,
        boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
        kvm_probe_timeout: float | None = None,
        reboot_mode: str | None = None,
        data_disks: Mapping[str, Path] | None = None,
        restore_from: qemu_snapshot.SavedGuest | None = None,
    ) -> None:
        if (kernel is None) == (run_script is None):
            raise ValueError("give either kernel/initrd/base_disk (direct boot) or run_script")
        if kernel is not None and (initrd is None or base_disk is None):
            raise ValueError("direct boot needs kernel, initrd and base_disk")
        self.name = name
        self.state_dir = Path(state_dir)
        self.kernel, self.initrd, self.append = kernel, initrd, append
        self.base_disk, self.run_script = base_disk, run_script
        self.memory_mb, self.cpus = memory_mb, cpus
        self.data_disks = dict(data_disks or {})
        self.restore_from = restore_from
        self._incoming: str | None = None
        self.requested_accel = (accel or settings().accel).lower()
        if self.requested_accel not in ACCELERATORS:
            raise ValueError(f"accel must be one of {ACCELERATORS}: {accel!r}")
        asked_by = "the caller" if accel else f"${Settings.variable('accel')}"
        self.accel_reason = "" if self.requested_accel == "auto" else f"asked for by {asked_by}"
        self.guest_ports = sorted({SSH_PORT, *forward_ports})
        self.ssh_key = ssh_key
        self.boot_timeout = boot_timeout
        self.kvm_probe_timeout = kvm_probe_timeout or (
            accel_choice.DIRECT_PROBE_TIMEOUT
            if run_script is None
            else accel_choice.SCRIPT_PROBE_TIMEOUT
        )
        self.reboot_mode = (reboot_mode or settings().reboot_mode).lower()
        if self.reboot_mode not in REBOOT_MODES:
            raise ValueError(f"reboot_mode must be one of {REBOOT_MODES}: {reboot_mode!r}")
        self.marker = f"vmtests-{name}-{uuid.uuid4().hex[:12]}"
        self.accel_used: str | None = None
        self.console = SerialConsole(self.state_dir / "console")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._forwards: dict[int, int] = {}
        self._qemu = QemuProcess(self, self.state_dir / "qemu-stderr.log")
        self._ready = False
        self._boot_id: str | None = None
        self._boot_index = 0
        self._pre_reboot_boot_id: str | None = None
        # restart mode: launches so far, the launch that served the last ready boot, and the
        # lock and flag that keep the restart follower out of a deliberate stop.
        self._launches = 0
        self._ready_launch = 0
        self._lifecycle = threading.RLock()
        self._stopping = False
        self._restart_error: DriverError | None = None

    # ---- properties --------------------------------------------------------------------------

    @property
    def acceleration(self) -> dict[str, str]:
        """Which accelerator runs the guest (``used``: ``kvm``, ``tcg``, "" before QEMU ran),
        which was asked for (``requested``: auto, kvm or tcg) and ``why`` that one, for reports."""
        return {
            "requested": self.requested_accel,
            "used": self.accel_used or "",
            "why": self.accel_reason or "not decided yet",
        }

    @property
    def process_running(self) -> bool:
        """True while the QEMU process exists."""
        return self._qemu.running

    @property
    def pid(self) -> int | None:
        """PID of the QEMU process (or of the NixOS run script, which ``exec``s QEMU)."""
        return self._qemu.pid

    @property
    def ssh_port(self) -> int:
        """Host port forwarded to the guest's sshd."""
        return self.forwarded_port(22)

    def forwarded_port(self, guest_port: int) -> int:
        """The host port (on 127.0.0.1) forwarded to ``guest_port``."""
        if guest_port not in self._forwards:
            raise DriverError(
                f"{self.name}: guest port {guest_port} is not forwarded "
                f"(forwarded: {sorted(self._forwards)}; pass it in forward_ports)"
            )
        return self._forwards[guest_port]

    def host_address(self, port: int) -> tuple[str, int] | None:
        """The forwarded host port of guest ``port`` on 127.0.0.1, if it is forwarded."""
        return ("127.0.0.1", self._forwards[port]) if port in self._forwards else None

    @property
    def overlay(self) -> Path:
        """The guest's writable disk: a qcow2 overlay on the base image (or NIX_DISK_IMAGE)."""
        return self.state_dir / f"{self.name}.qcow2"

    # ---- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        """Boot the guest and wait until the backdoor is ready (``boot_timeout``).

        A start that fails kills QEMU before raising: nothing is left running.
        """
        if self.process_running:
            return
        self._stopping, self._restart_error = False, None
        with log.nested(f"starting {self.name}"):
            deadline = time.monotonic() + self.boot_timeout
            try:
                if self.run_script is None:  # a NixOS run script brings its own QEMU
                    require_tools(qemu_launch.QEMU_BINARY, "qemu-img")
                if self.restore_from is not None:
                    self._restore(self.restore_from, deadline)
                    return
                if self.base_disk is not None:
                    qemu_launch.create_overlay(self.base_disk, self.overlay)
                accel = self.requested_accel
                if accel == "auto":
                    accel = self.choose_accel()
                if not self.process_running:
                    try:
                        self._launch(accel)
                    except MachineGone as error:
                        if accel != "kvm":
                            raise
                        said = accel_choice.last_line(self.stderr_tail()) or "(nothing)"
                        raise MachineGone(
                            f"{self.name}: QEMU did not start under KVM, which was "
                            f"{self.accel_reason} (accel=kvm); QEMU said: {said}\n{error}"
                        ) from error
                self._start_restart_follower()
                self._wait_for_backdoor(deadline, not_boot_id=None)
            except BaseException:
                self.close()
                raise

    def _start_restart_follower(self) -> None:
        if self.reboot_mode == "restart":
            threading.Thread(
                target=self._follow_restarts, name=f"{self.name}-restarts", daemon=True
            ).start()

    def _restore(self, saved: qemu_snapshot.SavedGuest, deadline: float) -> None:
        """Start from ``saved``: a fresh QEMU loads its memory and devices, on a fresh overlay
        of its disk, and the saved boot goes on (no reboot: same boot ID, journal, processes).

        The console capture begins with the saved boot's console, so that boot-scoped console
        waits and logs stay whole. Used once: a later start boots this guest's disk.
        """
        with log.nested(f"restoring {self.name} from {saved.directory}"):
            qemu_launch.create_overlay(saved.disk, self.overlay, base_format="qcow2")
            self.console.feed(saved.console_bytes())
            self._incoming = saved.incoming_uri
            try:
                self._launch(saved.accel)
            finally:
                self._incoming = None
            self._start_restart_follower()
            boot_id = qemu_snapshot.resume(self._qemu, saved, deadline)
            self.restore_from = None
            self._boot_id, self._boot_index = boot_id, max(0, self.console.boot_count - 1)
            self._ready_launch, self._ready = self._launches, True
            log.info(f"boot {boot_id} restored (console boot #{self._boot_index})")

    def save(self, directory: Path) -> qemu_snapshot.SavedGuest:
        """Save the running guest into ``directory``; it then goes on running
        (``vmtests.driver.qemu_snapshot.save``). Only a directly booted guest can be saved: a
        NixOS VM's run script shares the host's store over 9p, which QEMU will not migrate."""
        if self.base_disk is None or self.accel_used is None:
            raise DriverError(
                f"{self.name}: only a started, directly booted guest can be saved "
                "(a NixOS VM mounts the host's store over 9p, and QEMU refuses to migrate that)"
            )
        with self._lifecycle:
            if not self._ready:
                raise MachineGone(f"{self.name}: not answering (rebooting or stopped); not saved")
            console, disks = (self.console, self._boot_index), (self.overlay, self.base_disk)
            return qemu_snapshot.save(self._qemu, console, disks, self.accel_used, directory)

    def identity(self, accel: str) -> list[str]:
        """The QEMU command line that defines this guest under ``accel``: what every run of the
        same guest shares. Not the socket paths, the run marker, TCG's thread mode or the
        forwarded ports (slirp's forwards are the host's side: a guest saved with some restores
        with others)."""
        sockets = qemu_launch.PLACEHOLDER_SOCKETS
        spec = self._spec(accel, sockets, forwards={}, marker="vmtests-guest")
        overlay = str(self.overlay)
        return [
            word.replace(overlay, f"<overlay of {self.base_disk}>")
            for word in qemu_launch.identity_argv([Path(spec.argv[0]).name, *spec.argv[1:]])
        ]

    def choose_accel(self) -> str:
        """Decide ``accel=auto``: KVM when it is there and works, else TCG (``driver/accel.py``),
        saying why in the log and in ``acceleration``. May launch QEMU under KVM to probe; a
        successful probe leaves that QEMU running."""
        if not accel_choice.kvm_usable():
            self.accel_reason = f"{accel_choice.why_kvm_unusable()}: using TCG"
            log.warning(f"{self.name}: {self.accel_reason} (accel=auto)")
            return "tcg"
        key = accel_choice.verdict_key(self.run_script, qemu_launch.QEMU_BINARY)
        verdict = accel_choice.remembered(key)
        if verdict is not None and not verdict.usable:
            self.accel_reason = f"KVM failed on this host before ({verdict.reason}); using TCG"
            log.warning(
                f"{self.name}: {self.accel_reason} "
                f"(delete {accel_choice.verdict_file()} to probe again)"
            )
            return "tcg"
        return self._probe_kvm(key)

    def _probe_kvm(self, key: str) -> str:
        """Launch under KVM; if QEMU dies, the VM stops, or the kernel prints nothing in time,
        remember that (under ``key``) and restart under TCG with a warning."""
        seen = self.console.boot_count
        deadline = time.monotonic() + self.kvm_probe_timeout
        try:
            self._launch("kvm")
            reason = f"no kernel output under KVM within {self.kvm_probe_timeout:.0f}s"
            while time.monotonic() < deadline:
                slice_end = min(deadline, time.monotonic() + PROBE_SLICE)
                if self.console.wait_for_boot(seen + 1, slice_end):
                    self.accel_reason = "the KVM probe saw the kernel's first line"
                    accel_choice.remember(key, True, "the kernel printed its first line")
                    return "kvm"
                state = self._qemu.run_state()
                if not self.process_running or state in STOPPED_STATES:
                    reason = f"QEMU under KVM stopped (state {state or 'exited'})"
                    break
        except DriverError as error:
            said = accel_choice.last_line(self.stderr_tail())
            reason = f"QEMU failed under KVM: {str(error).splitlines()[0]}" + (
                f" (QEMU said: {said})" if said else ""
            )
        accel_choice.remember(key, False, reason)
        self.accel_reason = f"{reason}; restarted under TCG"
        log.warning(f"{self.name}: {reason}; restarting under TCG (accel=auto)")
        with self._lifecycle:
            self._release()
        return "tcg"

    def _launch(self, accel: str, keep_ports: bool = False) -> None:
        """Start QEMU under ``accel`` and connect console, backdoor and QMP.

        ``keep_ports`` first tries the host ports of the previous launch (a restart for a
        reboot keeps the addresses that ssh connections and callers already know).
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if not (keep_ports and attempt == 1 and self._forwards):
                self._forwards = {port: procs.free_port() for port in self.guest_ports}
            with log.nested(f"launching QEMU ({accel}) for {self.name}"), self._lifecycle:
                if self._qemu.launch(lambda sockets: self._spec(accel, sockets), self.console):
                    self.accel_used = accel
                    self._launches += 1
                    return
            log.warning(f"{self.name}: host port taken meanwhile (attempt {attempt}); retrying")
        raise DriverError(f"{self.name}: could not bind host ports in {PORT_ATTEMPTS} attempts")

    def _spec(
        self,
        accel: str,
        sockets: qemu_launch.Sockets,
        *,
        forwards: Mapping[int, int] | None = None,
        marker: str | None = None,
    ) -> qemu_launch.LaunchSpec:
        """The launch spec for this machine's mode, with its forwarded ports and run marker
        unless others are given."""
        forwards = self._forwards if forwards is None else forwards
        marker = self.marker if marker is None else marker
        if self.run_script is not None:
            return qemu_launch.nixos_spec(
                run_script=self.run_script,
                state_dir=self.state_dir,
                disk_image=self.overlay,
                memory_mb=self.memory_mb,
                cpus=self.cpus,
                accel=accel,
                forwards=forwards,
                sockets=sockets,
                marker=marker,
                no_reboot=self.reboot_mode == "restart",
            )
        assert self.kernel is not None
        assert self.initrd is not None
        return qemu_launch.direct_spec(
            kernel=self.kernel,
            initrd=self.initrd,
            append=self.append,
            overlay=self.overlay,
            memory_mb=self.memory_mb or GUEST_MEMORY_MB,
            # The contract's vCPUs, the same number a NixOS VM gets from virtualisation.cores.
            cpus=self.cpus or GUEST_CPUS,
            accel=accel,
            forwards=forwards,
            sockets=sockets,
            marker=marker,
            no_reboot=self.reboot_mode == "restart",
            data_disks=self.data_disks,
            incoming=self._incoming,
        )

    def _wait_for_backdoor(self, deadline: float, not_boot_id: str | None) -> None:
        """Wait for a ready line from a boot other than ``not_boot_id``."""
        channel = self._require_channel()
        with log.nested(f"waiting for the backdoor of {self.name}"):
            while True:
                match = channel.wait_for(BACKDOOR_READY_RE, deadline, "the backdoor ready line")
                boot_id = match.group(1).decode()
                if boot_id != not_boot_id:
                    break
            self._boot_id = boot_id
            # The kernel line of this boot was printed long before; let the reader catch up.
            sync = min(deadline, time.monotonic() + CONSOLE_SYNC_TIMEOUT)
            expected = self._boot_index + 1 if not_boot_id is not None else 1
            if not self.console.wait_for_boot(expected, sync):
                log.warning(f"{self.name}: no kernel boot line on ttyS0; console split unsure")
            self._boot_index = max(0, self.console.boot_count - 1)
            self._ready_launch = self._launches
            self._ready = True
            log.info(f"boot {boot_id} ready (console boot #{self._boot_index})")

    def _shutdown(self, timeout: float) -> None:
        """Power off cleanly (``systemctl poweroff``, then ACPI via QMP) and wait for exit."""
        self._stopping = True
        if not self.process_running:
            self.close()
            return
        with log.nested(f"shutting down {self.name}"):
            start = time.monotonic()
            try:
                if self._ready:
                    self._require_channel().run("systemctl --no-block poweroff", 30)
                else:
                    self._qemu.qmp_command("system_powerdown")
            except DriverError as error:
                log.warning(f"{self.name}: poweroff request failed ({error}); using ACPI")
                self._qemu.qmp_command("system_powerdown")
            self._ready = False
            exited = self._qemu.wait_exit(start + timeout / 2)
            if not exited:
                self._qemu.qmp_command("system_powerdown")
                exited = self._qemu.wait_exit(start + timeout)
            tail = self.diagnostics()
            self.close()
            if not exited:
                raise WaitTimeout(f"{self.name} to power off", time.monotonic() - start, tail)

    def _crash(self) -> None:
        """Power off hard: QMP ``quit`` (no guest shutdown), then make sure QEMU is gone."""
        self._stopping = True
        with log.nested(f"crashing {self.name}"):
            self._qemu.qmp_command("quit")
            self._qemu.wait_exit(time.monotonic() + 10)
            self.close()

    def _wait_until_down(self, deadline: float) -> None:
        """Wait until QEMU exits (the guest powered off), then release its sockets."""
        start = time.monotonic()
        self._stopping = True  # a poweroff in restart mode must not be followed by a restart
        if not self._qemu.wait_exit(deadline):
            self._stopping = False
            raise WaitTimeout(
                f"{self.name} to power off (QEMU to exit)",
                time.monotonic() - start,
                self.diagnostics(),
            )
        self.close()

    def send_monitor_command(self, command: str, timeout: float = 30.0) -> str:
        """Send one QEMU monitor (HMP) command, e.g. ``info status``, and return its output.

        nixpkgs' driver writes to a ``-monitor`` socket; ours has none, and QMP's
        ``human-monitor-command`` runs the same HMP command. ``MachineGone`` when QEMU is not
        running; ``DriverError`` when QMP refuses or does not answer within ``timeout``.
        """
        with log.nested(f"monitor command {command!r} on {self.name}"):
            output = self._qemu.qmp_call(
                "human-monitor-command", timeout, **{"command-line": command}
            )
        return str(output)

    def wait_for_new_boot(self, old_boot_id: str, timeout: float = DEFAULT_REBOOT_TIMEOUT) -> str:
        """Follow a reboot triggered elsewhere (ssh, the guest itself); return the new boot ID.

        Reads ready lines until one from a boot other than ``old_boot_id`` arrives.
        """
        with log.nested(f"following the reboot of {self.name} (boot {old_boot_id})"):
            self._ready = False
            self._pre_reboot_boot_id = old_boot_id
            self._wait_until_answering(time.monotonic() + timeout)
            assert self._boot_id is not None
            return self._boot_id

    def keep(
        self, state_file: Path, keep_for: float, *, target: str, remove: Sequence[Path] = ()
    ) -> keep_.KeptState:
        """Leave the guest running for ``keep_for`` seconds under its keeper and write its
        state to ``state_file`` (``vmtests.driver.keep``); ``close`` then leaves it alone.

        Only a guest started while ``keep.requested()`` can be kept (QEMU's parent-death
        signal ties every other one to the session). ``remove`` are paths the stop removes
        besides QEMU's runtime dir.
        """
        with self._lifecycle:
            proc = self._qemu.proc
            if proc is None or not keep_.is_kept_process(proc):
                raise DriverError(
                    f"{self.name}: QEMU was not started under a keeper (keep.keeping()); "
                    "it ends with the session"
                )
            known_hosts = None
            if self._ready:
                with contextlib.suppress(DriverError):
                    keys = self.succeed("cat /etc/ssh/ssh_host_*_key.pub").splitlines()
                    known_hosts = write_known_hosts(
                        self.state_dir / "known_hosts", "127.0.0.1", self.ssh_port, keys
                    )
            qemu_pid = keep_.qemu_child(proc.pid)
            self._stopping, self._ready = True, False
            keeper, runtime = self._qemu.hand_over()
            state = keep_.KeptState(
                name=self.name,
                target=target,
                keeper_pid=keeper.pid,
                keeper_start=keep_.start_time(keeper.pid),
                qemu_pid=qemu_pid,
                qemu_start=keep_.start_time(qemu_pid),
                qmp_socket=str(runtime / "q"),
                forwards={str(guest): host for guest, host in self._forwards.items()},
                ssh_port=self._forwards.get(SSH_PORT, 0),
                ssh_key=str(self.ssh_key) if self.ssh_key else None,
                known_hosts=str(known_hosts) if known_hosts else None,
                keep_for=keep_for,
                until=time.time() + keep_for,
                remove=[str(runtime), *(str(path) for path in remove)],
            )
            keep_.write_state(state_file, state)
            keep_.hand_over(keeper, keep_for, state_file)
            return state

    def _close(self) -> None:
        """Release everything: kill QEMU if still running, close sockets, remove the run dir."""
        self._stopping = True
        with self._lifecycle:
            self._release()

    def _release(self) -> None:
        """Kill QEMU if it still runs and drop its sockets; the console capture stays."""
        self._ready = False
        self._qemu.release()

    # ---- commands ----------------------------------------------------------------------------

    def _require_channel(self) -> ShellChannel:
        channel = self._qemu.channel
        if channel is None or not self.process_running:
            raise MachineGone(f"{self.name} is not running")
        return channel

    def _run(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` as root over the backdoor port; rc, stdout and stderr separately."""
        if not self._ready:
            raise MachineGone(f"{self.name}: the backdoor is not ready (not started/rebooting)")
        result = self._require_channel().run(command, timeout)
        log.info(f"{self.name}# {command[:120]!s} -> rc={result.rc} ({result.duration:.2f}s)")
        return result

    def _issue_reboot(self) -> None:
        """Ask systemd to reboot; the command returns before the shell is killed.

        A refused request (e.g. rc 127: ``setsid`` missing from the guest's PATH) raises
        ``CommandFailed`` at once instead of waiting out the reboot timeout.
        """
        self._pre_reboot_boot_id = self._boot_id
        result = self._require_channel().run(REBOOT_COMMAND, 30)
        if result.rc != 0:
            raise CommandFailed(result, expectation="0 (the reboot request was not accepted)")
        self._ready = False

    def _wait_until_answering(self, deadline: float) -> None:
        """Wait for the ready line of a boot other than the one that was asked to reboot.

        In ``restart`` mode QEMU runs with ``-no-reboot``: the guest's reboot ends the QEMU
        process after a full guest shutdown, and the same disk is booted again by a fresh
        QEMU (fresh memory), as nixpkgs' tests do with ``shutdown()`` and ``start()``. In
        ``reset`` mode QEMU resets the guest in place.
        """
        if self.reboot_mode == "restart":
            self._await_restart(deadline)
        self._wait_for_backdoor(deadline, not_boot_id=self._pre_reboot_boot_id)

    def _follow_restarts(self) -> None:
        """Restart mode: whenever the guest reboots (QEMU exits under ``-no-reboot``), start a
        fresh QEMU on the same disk, whoever asked for the reboot (this driver, ssh, the guest).

        A QEMU that ends any other way (poweroff, crash, a deliberate stop) stays down. This
        thread launches the new QEMU and then lives as long as it does: QEMU's parent-death
        signal (``procs.spawn``) belongs to the thread that started it.
        """
        while True:
            proc = self._qemu.proc
            if proc is None:
                return
            proc.wait()
            self.console.wait_detached(timeout=5.0)  # the last console bytes say why it ended
            with self._lifecycle:
                if self._stopping or self._qemu.proc is not proc:
                    return
                if RESTART_LINE not in self.console.text():
                    log.warning(f"{self.name}: QEMU exited without a guest reboot; stays down")
                    return
                with log.nested(f"{self.name} rebooted: a fresh QEMU boots the same disk"):
                    self._release()
                    try:
                        self._launch(self.accel_used or "tcg", keep_ports=True)
                    except DriverError as error:
                        self._restart_error = error
                        return

    def _await_restart(self, deadline: float) -> None:
        """Wait until the restart follower has launched QEMU again for the reboot."""
        start = time.monotonic()
        with log.nested(f"waiting for {self.name} to shut down and start again"):
            while self._launches <= self._ready_launch:
                if self._restart_error is not None:
                    raise MachineGone(
                        f"{self.name}: QEMU could not start again: {self._restart_error}"
                    )
                if self._stopping:
                    raise MachineGone(f"{self.name} was stopped while it rebooted")
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"{self.name} to shut down for its reboot and start again (-no-reboot)",
                        time.monotonic() - start,
                        self.diagnostics(),
                    )
                time.sleep(0.1)

    # ---- console -----------------------------------------------------------------------------

    @property
    def boot_index(self) -> int:
        """Index of the running boot in the console capture (0 for the first boot)."""
        return self._boot_index

    def console_log(self, boot_index: int) -> Path:
        """Path of the console log of boot ``boot_index``."""
        return self.console.log_path(boot_index)

    def console_text(self, boot_index: int | None = None) -> str:
        """Console text of ``boot_index`` (default: the running boot)."""
        return self.console.text(self._boot_index if boot_index is None else boot_index)

    def wait_for_console_text(self, pattern: str, timeout: float = 60.0) -> str:
        """Wait until regex ``pattern`` appears on the console of the running boot or later."""
        with log.nested(f"waiting for /{pattern}/ on the console of {self.name}"):
            return self.console.wait_for_text(pattern, self._boot_index, timeout).group(0)

    def diagnostics(self) -> str:
        """Console tail of the latest boot and QEMU's stderr tail, for error messages."""
        return (
            f"--- console (last lines of the latest boot of {self.name}) ---\n"
            f"{self.console.tail()}\n--- QEMU stderr ---\n{self.stderr_tail() or '(empty)'}"
        )

    def stderr_tail(self) -> str:
        """The last characters QEMU wrote to its stderr log."""
        return self._qemu.stderr_tail()
