"""The snapshot cache's bookkeeping, on a guest whose start and save only write files: which
preparations run, what is saved and restored, and what decides the key."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from vmtests.contracts.settings import SettingError
from vmtests.driver.errors import DriverError
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.qemu_snapshot import SavedGuest
from vmtests.guest import snapshot_cache
from vmtests.guest.build_cache import prune
from vmtests.guest.snapshot_cache import Preparation, prepare_guest, snapshot_key


class FileGuest(QemuMachine):
    """A guest that boots, restores and saves by writing files; it records what happened."""

    events: list[str]

    def _start(self) -> None:
        saved = self.restore_from
        self.events.append(f"restore {saved.boot_id}" if saved else "boot")
        self.restore_from = None
        self.accel_used = "tcg"

    def save(self, directory: Path) -> SavedGuest:
        self.events.append("save")
        directory.mkdir(parents=True)
        for name in ("memory.lz4", "disk.qcow2", "console.log"):
            (directory / name).write_text(name)
        state = {"boot_id": "b00t", "accel": "tcg", "paused_at": time.time()}
        (directory / "state.json").write_text(json.dumps(state))
        return SavedGuest.load(directory)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory; snapshots usable whatever the host has installed."""
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(snapshot_cache, "snapshots_unavailable", lambda: "")
    return tmp_path / "cache" / "snapshots"


def _guest(tmp_path: Path, name: str = "guest", **options: object) -> FileGuest:
    guest = FileGuest(
        name,
        tmp_path / name,
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
        base_disk=tmp_path / "disk.raw",
        accel="tcg",
        **options,  # type: ignore[arg-type]
    )
    guest.events = []
    return guest


def _chain() -> Preparation:
    """booted -> base -> target, each noting its preparation and leaving a witness."""

    def step(name: str, parent: Preparation | None) -> Preparation:
        def prepare(machine: QemuMachine) -> None:
            assert isinstance(machine, FileGuest)
            machine.events.append(f"prepare {name}")

        return Preparation(name, prepare, {"name": name}, parent, lambda _: {"state": name})

    return step("target", step("base", step("booted", None)))


def test_a_cold_cache_prepares_the_chain_saving_each_state(cache: Path, tmp_path: Path) -> None:
    target = _chain()
    guest = _guest(tmp_path)
    prepared = prepare_guest(guest, target)
    assert not prepared.restored
    assert guest.events == [
        *("boot", "prepare booted", "save"),
        *("prepare base", "save", "prepare target", "save"),
    ]
    assert sorted(path.name for path in cache.iterdir() if not path.name.startswith(".")) == sorted(
        snapshot_key(guest, step, "tcg") for step in target.chain
    )
    assert prepared.witness == {"state": "target"}


def test_a_warm_cache_restores_without_preparing(cache: Path, tmp_path: Path) -> None:
    target = _chain()
    prepare_guest(_guest(tmp_path, "first"), target)
    second = _guest(tmp_path, "second")
    prepared = prepare_guest(second, target)
    assert prepared.restored
    assert second.events == ["restore b00t"]
    assert prepared.key == snapshot_key(second, target, "tcg")
    assert "restored from the snapshot" in prepared.how


def test_the_witness_of_the_saved_guest_is_kept(cache: Path, tmp_path: Path) -> None:
    def note(_: QemuMachine) -> None:
        pass

    preparation = Preparation("noted", note, witness=lambda _: {"rows": [1, 2]})
    first = prepare_guest(_guest(tmp_path, "first"), preparation)
    second = prepare_guest(_guest(tmp_path, "second"), preparation)
    assert first.witness == second.witness == {"rows": [1, 2]}


def test_the_key_follows_every_input(cache: Path, tmp_path: Path) -> None:
    target = _chain()
    guest = _guest(tmp_path)
    key = snapshot_key(guest, target, "tcg")
    assert key == snapshot_key(_guest(tmp_path, "renamed", forward_ports=(8000,)), target, "tcg")
    assert key != snapshot_key(_guest(tmp_path, "small", memory_mb=1024), target, "tcg")
    assert key != snapshot_key(guest, target, "kvm")
    base = target.parent
    assert base is not None
    changed_base = Preparation(base.name, base.prepare, {"name": "other"}, parent=base.parent)
    changed = Preparation(target.name, target.prepare, target.inputs, parent=changed_base)
    assert key != snapshot_key(guest, changed, "tcg")  # a parent's input changed


def test_a_rebuilt_image_at_the_same_path_is_another_guest(cache: Path, tmp_path: Path) -> None:
    """The image cache rebuilds a pruned build at its old path, never byte for byte the same: a
    guest saved above the old disk must not be restored above the new one."""
    target = _chain()
    disk = tmp_path / "disk.raw"
    disk.write_bytes(b"first build")
    key = snapshot_key(_guest(tmp_path), target, "tcg")
    assert key == snapshot_key(_guest(tmp_path), target, "tcg")
    disk.unlink()
    disk.write_bytes(b"other build")
    os.utime(disk, ns=(disk.stat().st_atime_ns, disk.stat().st_mtime_ns + 1))
    assert key != snapshot_key(_guest(tmp_path), target, "tcg")


def test_a_kvm_guest_belongs_to_its_host_cpu(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "flags" in snapshot_cache.host_cpu()  # this host's, before it is replaced
    target, guest = _chain(), _guest(tmp_path)
    keys = {}
    for cpu in ("flags: sse2 avx2", "flags: sse2"):
        monkeypatch.setattr(snapshot_cache, "host_cpu", lambda cpu=cpu: cpu)
        keys[cpu] = (snapshot_key(guest, target, "kvm"), snapshot_key(guest, target, "tcg"))
    (kvm_a, tcg_a), (kvm_b, tcg_b) = keys.values()
    assert kvm_a != kvm_b  # KVM's -cpu max is the host's CPU
    assert tcg_a == tcg_b  # TCG emulates the same CPU anywhere


def test_snapshots_off_boots_and_prepares_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VMTESTS_SNAPSHOTS", "off")
    guest = _guest(tmp_path)
    prepared = prepare_guest(guest, _chain())
    assert guest.events == ["boot", "prepare booted", "prepare base", "prepare target"]
    assert (prepared.restored, prepared.key) == (False, "")
    assert "VMTESTS_SNAPSHOTS=off" in prepared.how
    assert not (tmp_path / "cache" / "snapshots").exists()
    monkeypatch.setenv("VMTESTS_SNAPSHOTS", "maybe")
    with pytest.raises(SettingError, match=r"snapshots \(\$VMTESTS_SNAPSHOTS\) is 'maybe'"):
        prepare_guest(_guest(tmp_path, "other"), _chain())


def test_another_process_saving_the_same_state_is_not_waited_for(
    cache: Path, tmp_path: Path
) -> None:
    root = Preparation("booted", lambda machine: None)
    guest = _guest(tmp_path)
    cache.mkdir(parents=True)
    with (cache / f".lock-{snapshot_key(guest, root, 'tcg')}").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process holds it (flock is per open file)
        prepared = prepare_guest(guest, root)
    assert guest.events == ["boot"]  # prepared here, not saved
    assert not prepared.restored
    assert not (cache / prepared.key).exists()


def test_a_failed_restore_names_the_entry_to_delete(cache: Path, tmp_path: Path) -> None:
    root = Preparation("booted", lambda machine: None)
    prepare_guest(_guest(tmp_path, "first"), root)
    broken = _guest(tmp_path, "broken")

    def fail() -> None:
        raise DriverError("QEMU exited while loading")

    broken._start = fail  # type: ignore[method-assign]
    with pytest.raises(DriverError, match="delete that directory") as caught:
        prepare_guest(broken, root)
    assert str(cache / snapshot_key(broken, root, "tcg")) in str(caught.value)


def test_pruning_keeps_the_most_recently_used(tmp_path: Path) -> None:
    for index in range(5):
        entry = tmp_path / f"entry{index}"
        entry.mkdir()
        (entry / "manifest.json").write_text("{}")
        os.utime(entry / "manifest.json", (1000 + index, 1000 + index))
    os.utime(tmp_path / "entry0" / "manifest.json")  # just restored
    (tmp_path / f"tmp-being-written-{os.getpid()}").mkdir()
    (tmp_path / "tmp-left-by-a-killed-process-999999999").mkdir()
    prune(tmp_path, keep=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "entry0",
        "entry4",
        f"tmp-being-written-{os.getpid()}",
    ]
