"""vCPUs come from the instrumentation contract: the reference guest gets ``-smp <cpus>`` and a
NixOS VM keeps the ``-smp`` its run script takes from ``virtualisation.cores`` (nixpkgs
nixos/modules/virtualisation/qemu-vm.nix), which hosts/vm-test/common.nix sets from the same
contract. No QEMU is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vmtests.contracts.instrumentation import GUEST_CPUS
from vmtests.driver import qemu_launch
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.qemu_launch import Sockets


def _smp(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-smp"]


def _sockets(tmp_path: Path) -> Sockets:
    return Sockets(serial=tmp_path / "s", backdoor=tmp_path / "b", qmp=tmp_path / "q")


def _reference(tmp_path: Path) -> QemuMachine:
    """A reference guest's machine (never started: only its command line is read)."""
    return QemuMachine(
        "reference",
        tmp_path / "state",
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
        base_disk=tmp_path / "disk.qcow2",
    )


def test_a_nixos_vm_keeps_the_cores_of_its_configuration(tmp_path: Path) -> None:
    machine = QemuMachine("nixos", tmp_path / "state", run_script=tmp_path / "run-vm-test-vm")
    spec = machine._spec("tcg", _sockets(tmp_path))
    assert _smp(spec.argv) == [], spec.argv


def test_the_reference_guest_gets_the_contract_cpus(tmp_path: Path) -> None:
    machine = _reference(tmp_path)
    spec = machine._spec("tcg", _sockets(tmp_path))
    assert _smp(spec.argv) == [str(GUEST_CPUS)], spec.argv


def test_an_explicit_cpu_count_still_wins(tmp_path: Path) -> None:
    machine = QemuMachine(
        "nixos", tmp_path / "state", run_script=tmp_path / "run-vm-test-vm", cpus=1
    )
    assert _smp(machine._spec("tcg", _sockets(tmp_path)).argv) == ["1"]


def _accel(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-accel"]


def test_tcg_threads_only_when_every_vcpu_of_every_guest_has_a_core() -> None:
    assert qemu_launch.tcg_thread_mode(cpus=2, host_cores=2, guests_at_once=1) == "multi"
    assert qemu_launch.tcg_thread_mode(cpus=2, host_cores=2, guests_at_once=2) == "single"
    assert qemu_launch.tcg_thread_mode(cpus=2, host_cores=1, guests_at_once=1) == "single"
    assert qemu_launch.tcg_thread_mode(cpus=2, host_cores=8, guests_at_once=4) == "multi"


@pytest.mark.parametrize(("workers", "expected"), [("3", "single"), ("2", "multi"), ("", "multi")])
def test_the_reference_guest_tcg_thread_follows_the_xdist_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: str, expected: str
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2 * GUEST_CPUS)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    machine = _reference(tmp_path)
    assert _accel(machine._spec("tcg", _sockets(tmp_path)).argv) == [f"tcg,thread={expected}"]
    assert _accel(machine._spec("kvm", _sockets(tmp_path)).argv) == ["kvm"]
