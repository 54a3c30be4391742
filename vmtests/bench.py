"""Driver benchmark: prints figures, asserts nothing (performance is measured, never tested).

``python -m vmtests.bench`` (or ``vmtests bench``) reports:

- reference image build time, cold (empty cache dir) and warm (cached);
- boot-to-ready time of the reference guest (QEMU start until the backdoor answers);
- command round-trip median and p95 over the backdoor and over ssh, on the same guest;
- reboot-to-ready time (``Machine.reboot``: request until the new boot answers) in both reboot
  modes, ``restart`` (the guest shuts down, a fresh QEMU boots the same disk) and ``reset``
  (QEMU resets the guest in place), each against the cold boot of its own guest;
- where ``/dev/kvm`` exists: the cost of ``accel=auto``'s decision, probing afresh and with
  the verdict remembered from an earlier probe;
- guests from snapshots (``vmtests.guest.snapshot_cache``), each step against the same step
  without them: a guest booted, settled and given cfx-llm2's target serving (the state the
  certification and the negative controls start from) against saving it and restoring it
  (QEMU's start until the first command answered); a control's reset by ``reset_to_target``
  against a fresh restore; one whole control both ways (on one guest after the reset of the
  control before, and on a guest restored in the state it starts from).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from vmtests.contracts.settings import ACCELERATORS, Settings, settings
from vmtests.driver import accel, qemu_launch
from vmtests.driver.machine import Machine
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.qemu_snapshot import SavedGuest
from vmtests.guest import REFERENCE_TARGET
from vmtests.guest.access import ssh_to_guest
from vmtests.guest.image import reference_image, start_reference_guest
from vmtests.guest.stub_image import stub_image
from vmtests.guest.targets import machine_from_target
from vmtests.profiles import load_profile
from vmtests.scenario.controls.catalogue import CONTROLS
from vmtests.scenario.controls.reset import reset_to_target, run_control
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.prepared import starting_state, target_serving

BENCH_CONTROL = "systemctl set-environment"
"""The control timed whole, both ways: a typical one (units staged, a reload, a restart)."""
PREPARATION_STEPS = ("boot to answering", "settle", "base deployment", "target serving")
"""The steps to the state the controls start from, timed one by one without snapshots."""


@contextmanager
def _cache_dir(path: Path) -> Iterator[None]:
    """Point the image cache at ``path`` for the duration of the block (its setting's variable,
    which ``vmtests.contracts.settings`` reads at every use)."""
    variable = Settings.variable("cache_dir")
    previous = os.environ.get(variable)
    os.environ[variable] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous


def _timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` took."""
    start = time.monotonic()
    action()
    return time.monotonic() - start


def round_trips(machine: Machine, count: int) -> list[float]:
    """Wall-clock seconds of ``count`` trivial commands (``true``) on ``machine``."""
    return [_timed(lambda: machine.succeed("true", timeout=30)) for _ in range(count)]


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def _line(label: str, value: str) -> None:
    print(f"{label:<44} {value}", flush=True)


def measure_round_trips(
    guest: QemuMachine, ssh_dir: Path, count: int, record: Callable[[str, str], None]
) -> None:
    """Median and p95 of trivial commands over the backdoor and over ssh, same guest."""
    ssh = ssh_to_guest(guest, ssh_dir)
    with ssh:
        backdoor = round_trips(guest, count)
        over_ssh = round_trips(ssh, count)
    for label, samples in (("backdoor", backdoor), ("ssh", over_ssh)):
        median, p95 = statistics.median(samples), percentile(samples, 0.95)
        record(
            f"round trip over {label}, n={len(samples)} (ms)",
            f"median {median * 1000:.1f}  p95 {p95 * 1000:.1f}",
        )
    ratio = statistics.median(backdoor) / statistics.median(over_ssh)
    record("backdoor / ssh median round-trip ratio", f"{ratio:.2f}")


def measure_accel_choice(state: Path, record: Callable[[str, str], None]) -> None:
    """``accel=auto``'s decision: a fresh probe, then with the verdict it remembered."""
    verdict = state / "kvm-verdict.json"
    original = accel.verdict_file
    accel.verdict_file = lambda: verdict  # a private verdict: the user's stays untouched
    try:
        image = reference_image()
        for label in ("fresh probe", "remembered verdict"):
            guest = QemuMachine(
                name="bench-accel",
                state_dir=state / label.replace(" ", "-"),
                kernel=image.kernel,
                initrd=image.initrd,
                append=image.append,
                base_disk=image.disk,
                accel="auto",
            )
            try:
                # What start() does before it decides: the probe boots the guest's own disk.
                qemu_launch.create_overlay(image.disk, guest.overlay)
                start = time.monotonic()
                chosen = guest.choose_accel()
                seconds = time.monotonic() - start
                record(f"accel=auto decision, {label} (s)", f"{seconds:.2f} -> {chosen}")
            finally:
                guest.close()
    finally:
        accel.verdict_file = original


def _reference_guest(
    state: Path, name: str, accel_asked: str, saved: SavedGuest | None = None
) -> QemuMachine:
    machine = machine_from_target(REFERENCE_TARGET, state / name, name=name, accel=accel_asked)
    assert isinstance(machine, QemuMachine)
    machine.restore_from = saved
    return machine


def measure_snapshots(state: Path, record: Callable[[str, str], None], accel_asked: str) -> None:
    """Save and restore against boot and deployment, and a control's reset both ways."""
    switch = ReferenceSwitch(load_profile("cfx-llm2"))
    control = next(control for control in CONTROLS if control.name == BENCH_CONTROL)
    # Resolving the units on the host comes first: it is not a guest figure.
    serving, begins = target_serving(switch), starting_state(switch, control.starts_from)
    fresh = _reference_guest(state, "bench-fresh", accel_asked)
    try:
        steps = [_timed(fresh.start)]
        steps += [_timed(partial(step.prepare, fresh)) for step in serving.chain]
        for label, seconds in zip(PREPARATION_STEPS, steps, strict=True):
            record(f"without: {label} (s)", f"{seconds:.1f}")
        record("snapshot save (s)", f"{_timed(partial(fresh.save, state / 'serving')):.1f}")
        if begins.name != serving.name:  # the control begins with the target installed, stopped
            begins.prepare(fresh)
        fresh.save(state / "begins")
    finally:
        fresh.close()
    guest = _reference_guest(state, "bench-reset", accel_asked, SavedGuest.load(state / "serving"))
    try:
        restores = [_timed(guest.start)]
        control.apply(guest, switch)
        reset = _timed(partial(reset_to_target, guest, switch))
        with_reset = _timed(partial(run_control, guest, switch, control))
    finally:
        guest.close()
    guest = _reference_guest(
        state, "bench-restored", accel_asked, SavedGuest.load(state / "begins")
    )
    try:
        start = time.monotonic()
        guest.start()
        restores.append(time.monotonic() - start)
        run_control(guest, switch, control, reset=False)
        with_restore = time.monotonic() - start
    finally:
        guest.close()
    restore = statistics.median(restores)
    shown = ", ".join(f"{seconds:.1f}" for seconds in restores)
    record("restore to answering (s)", f"median {restore:.1f}  ({shown})")
    record("restore / (boot and preparation)", f"{restore / sum(steps):.3f}")
    record("control reset: reset_to_target (s)", f"{reset:.1f}")
    record("control reset, restore / reset_to_target", f"{restore / reset:.2f}")
    record(f"control {control.name!r}, reset on one guest (s)", f"{with_reset:.1f}")
    record(f"control {control.name!r}, on a restored guest (s)", f"{with_restore:.1f}")
    record("whole control, restored / reset", f"{with_restore / with_reset:.2f}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures; returns the exit status."""
    parser = argparse.ArgumentParser(prog="vmtests bench", description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50, help="round trips per channel")
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold image build")
    parser.add_argument("--reboots", type=int, default=2, help="reboots per reboot mode")
    parser.add_argument(
        "--only-snapshots", action="store_true", help="only the snapshot figures (no image build)"
    )
    parser.add_argument(
        "--accel",
        default=settings().accel,
        choices=ACCELERATORS,
        help=f"QEMU acceleration (default: the accel setting, ${Settings.variable('accel')}, "
        "else auto)",
    )
    args = parser.parse_args(argv)
    figures: list[tuple[str, str]] = []

    def record(label: str, value: str) -> None:
        figures.append((label, value))
        _line(label, value)

    if args.only_snapshots:
        with tempfile.TemporaryDirectory(prefix="vmtests-bench-") as state:
            measure_snapshots(Path(state), record, args.accel)
        return 0
    if not args.skip_cold:
        # Cold and warm on the same fresh cache, so "warm" really is the reuse of that build.
        with (
            tempfile.TemporaryDirectory(prefix="vmtests-bench-cache-") as cold,
            _cache_dir(Path(cold)),
        ):
            record("image build, cold (s)", f"{_timed(reference_image):.1f}")
            record("image build, warm (s)", f"{_timed(reference_image):.3f}")
            record("stub image build, cold (s)", f"{_timed(stub_image):.1f}")
            record("stub image build, warm (s)", f"{_timed(stub_image):.3f}")
    else:
        reference_image()  # the user's cache may be stale: (re)building it is not a figure
        stub_image()
        record("image build, warm (s)", f"{_timed(reference_image):.3f}")
        record("stub image build, warm (s)", f"{_timed(stub_image):.3f}")

    with tempfile.TemporaryDirectory(prefix="vmtests-bench-") as state:
        for mode in ("restart", "reset"):
            start = time.monotonic()
            guest = start_reference_guest(
                Path(state) / mode, name=f"bench-{mode}", accel=args.accel, reboot_mode=mode
            )
            try:
                boot = time.monotonic() - start
                record(f"boot to ready, {guest.accel_used}, {mode} guest (s)", f"{boot:.1f}")
                if mode == "restart":
                    measure_round_trips(guest, Path(state) / "ssh", args.count, record)
                reboots = [_timed(guest.reboot) for _ in range(args.reboots)]
                median = statistics.median(reboots)
                record(
                    f"reboot to ready, {mode}, n={len(reboots)} (s)",
                    f"median {median:.1f}  ({', '.join(f'{r:.1f}' for r in reboots)})",
                )
                record(f"reboot / cold boot, {mode}", f"{median / boot:.2f}")
            finally:
                guest.close()
        if accel.kvm_usable():
            measure_accel_choice(Path(state) / "accel", record)
        measure_snapshots(Path(state) / "snapshots", record, args.accel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
