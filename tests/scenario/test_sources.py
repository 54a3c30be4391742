"""Unit tests of the runtime-only-source checks: each catches its own mechanism, by finding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from scenario_support import GIB_KIB, good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.scenario.collection.snapshot import ContainerState, Snapshot
from vmtests.scenario.judgement.results import failures
from vmtests.scenario.judgement.sources import check_sources, is_runtime_path, origin_of

DROP_IN = "/run/systemd/system/tenstorrent-serving.service.d/50-validated.conf"
Mutate = Callable[[Snapshot], None]
MECHANISMS: list[tuple[Finding, Mutate, str]] = []
"""Each mechanism below, the finding that must catch it and a phrase its message must hold."""


def caught_by(check: Check, reason: Reason, needle: str) -> Callable[[Mutate], Mutate]:
    """Register the decorated mechanism in ``MECHANISMS`` with what must catch it."""

    def register(mutate: Mutate) -> Mutate:
        MECHANISMS.append((Finding(check, reason), mutate, needle))
        return mutate

    return register


@caught_by(Check.RUNTIME_DROP_IN, Reason.RUNTIME_DROP_IN, "is runtime-only (under /run)")
def _runtime_drop_in(snapshot: Snapshot) -> None:
    snapshot.unit.properties["DropInPaths"] = DROP_IN
    snapshot.unit.files[DROP_IN] = "[Service]\nEnvironment=QWEN36_SDPA_STREAMING=1\n"


@caught_by(Check.RUNTIME_UNIT_FILE, Reason.RUNTIME_UNIT_FILE, "runtime-only unit file")
def _runtime_fragment(snapshot: Snapshot) -> None:
    snapshot.unit.properties["FragmentPath"] = "/run/systemd/transient/tenstorrent-serving.service"


@caught_by(Check.MANAGER_ENVIRONMENT, Reason.MANAGER_VARIABLE, "set-environment)")
def _manager_environment(snapshot: Snapshot) -> None:
    snapshot.manager_environment["QWEN36_SDPA_STREAMING"] = "1"


@caught_by(Check.NOT_RELOADED, Reason.NEED_DAEMON_RELOAD, "(NeedDaemonReload=yes)")
def _not_reloaded(snapshot: Snapshot) -> None:
    snapshot.unit.properties["NeedDaemonReload"] = "yes"


@caught_by(Check.NOT_RESTARTED, Reason.ARGV_DIFFERS, "the unit's ExecStart is now")
def _argv_not_restarted(snapshot: Snapshot) -> None:
    assert snapshot.server is not None
    snapshot.server.argv.remove("--no-async-scheduling")


@caught_by(Check.NOT_RESTARTED, Reason.ENVIRONMENT_DIFFERS, "QWEN36_MERGE_BATCH_GUARD")
def _env_not_restarted(snapshot: Snapshot) -> None:
    assert snapshot.server is not None
    del snapshot.server.environment["QWEN36_MERGE_BATCH_GUARD"]


@caught_by(Check.OUTSIDE_UNIT, Reason.OUTSIDE_UNIT, "is pid 4242")
def _outside_unit(snapshot: Snapshot) -> None:
    assert snapshot.listener is not None
    snapshot.listener.pid = 4242
    snapshot.listener.cgroup = "0::/system.slice/vmtests-backdoor.service"
    snapshot.unit.properties.update(ActiveState="inactive", MainPID="0")


@caught_by(Check.OUTSIDE_UNIT, Reason.LISTENER_UNKNOWN, "`ss -ltnp` (iproute2)")
def _listener_not_found(snapshot: Snapshot) -> None:
    """What a guest without `ss` produces: the server answers but no listener is recorded."""
    snapshot.listener = None


@caught_by(Check.NOT_ENABLED, Reason.NOT_ENABLED, "it will not start at the next boot")
def _not_enabled(snapshot: Snapshot) -> None:
    snapshot.unit.properties["UnitFileState"] = "disabled"


@caught_by(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGES_RUNTIME_ONLY, "written at runtime")
def _runtime_hugepages(snapshot: Snapshot) -> None:
    snapshot.hugepages.unit.properties = {"LoadState": "not-found"}


@caught_by(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGE_UNIT_MASKED, "is masked")
def _masked_hugepages(snapshot: Snapshot) -> None:
    snapshot.hugepages.unit.properties.update(LoadState="masked", UnitFileState="masked")


@caught_by(Check.GENERATION, Reason.BOOT_DEFAULT_DIFFERS, "did not set the boot default")
def _generation(snapshot: Snapshot) -> None:
    snapshot.generations = {
        "/run/current-system": "/nix/store/new-system",
        "/run/booted-system": "/nix/store/old-system",
        "/nix/var/nix/profiles/system": "/nix/store/old-system",
    }


def test_correct_snapshot_has_durable_sources() -> None:
    results = check_sources(good_snapshot(), GIB_KIB)
    assert failures(results) == []
    assert {r.check for r in results} >= {
        Check.RUNTIME_UNIT_FILE,
        Check.MANAGER_ENVIRONMENT,
        Check.NOT_RESTARTED,
        Check.OUTSIDE_UNIT,
        Check.NOT_ENABLED,
        Check.HUGEPAGE_SOURCE,
    }


@pytest.mark.parametrize(
    ("finding", "mutate", "needle"), MECHANISMS, ids=[m[1].__name__.strip("_") for m in MECHANISMS]
)
def test_each_runtime_source_is_flagged_with_its_own_finding(
    finding: Finding, mutate: Mutate, needle: str
) -> None:
    snapshot = good_snapshot()
    mutate(snapshot)
    found = failures(check_sources(snapshot, GIB_KIB))
    assert [r.finding for r in found] == [finding], found
    assert needle in found[0].message


def test_findings_of_different_mechanisms_differ() -> None:
    found = set()
    for _, mutate, _ in MECHANISMS:
        snapshot = good_snapshot()
        mutate(snapshot)
        found.add(failures(check_sources(snapshot, GIB_KIB))[0].finding)
    assert len(found) == len(MECHANISMS)


def test_boot_time_sysctl_or_cmdline_also_source_hugepages() -> None:
    snapshot = good_snapshot()
    _runtime_hugepages(snapshot)
    snapshot.hugepages.sysctl_lines = ["/etc/sysctl.d/90-hugepages.conf:vm.nr_hugepages=2"]
    assert failures(check_sources(snapshot, GIB_KIB)) == []
    snapshot.hugepages.sysctl_lines = []
    snapshot.kernel_cmdline += " hugepagesz=1G hugepages=2"
    assert failures(check_sources(snapshot, GIB_KIB)) == []


def test_manager_path_and_locale_are_not_flagged() -> None:
    snapshot = good_snapshot()
    snapshot.manager_environment |= {"LC_ALL": "C", "LANG": "C.UTF-8", "PATH": "/bin"}
    assert failures(check_sources(snapshot, GIB_KIB)) == []


def test_runtime_paths_and_origins() -> None:
    assert is_runtime_path(DROP_IN)
    assert not is_runtime_path("/etc/systemd/system/tenstorrent-serving.service")
    assert not is_runtime_path("/run/systemd/generator/tenstorrent-serving.service")
    snapshot = good_snapshot()
    _runtime_drop_in(snapshot)
    _manager_environment(snapshot)
    origin = origin_of(snapshot, "QWEN36_SDPA_STREAMING")
    assert "drop-in " + DROP_IN + " (runtime-only, under /run)" in origin
    assert "the service manager's environment" in origin
    assert origin_of(snapshot, "--no-such-flag") == ""


START_SCRIPT = "/usr/lib/vmtests/store/0-unit-script-tenstorrent-serving-start/bin/start"


def _container_snapshot(live_argv: list[str]) -> Snapshot:
    """A container-run service: the unit's main process is the attached `docker run`."""
    snapshot = good_snapshot()
    main = snapshot.main_process
    assert main is not None
    script = "#!/bin/bash\nset -e\n\nexec docker  \\\n  run \\\n  --name=x \\\n  img \\\n  --a 1\n"
    snapshot.start_script = {START_SCRIPT: script}
    snapshot.unit.properties["ExecStart"] = (
        f"{{ path={START_SCRIPT} ; argv[]={START_SCRIPT} ; ignore_errors=no }}"
    )
    snapshot.main_process = replace(main, argv=live_argv, environment={})
    snapshot.unit.environment = {}
    # The container itself (docker inspect) runs what the script passes after the image.
    process = replace(main, origin="container", argv=["/entrypoint", "--a", "1"], environment={})
    snapshot.container = ContainerState("x", process=process)
    return snapshot


def test_container_launcher_matching_the_start_script_passes() -> None:
    snapshot = _container_snapshot(["docker", "run", "--name=x", "img", "--a", "1"])
    results = [r for r in check_sources(snapshot, GIB_KIB) if r.check == Check.NOT_RESTARTED]
    assert [r.ok for r in results] == [True]


def test_container_launcher_older_than_the_start_script_is_caught() -> None:
    snapshot = _container_snapshot(["docker", "run", "--name=x", "img", "--a", "0"])
    found = failures(check_sources(snapshot, GIB_KIB))
    messages = [r.message for r in found if r.check == Check.NOT_RESTARTED]
    assert len(messages) == 1
    assert "runs `docker run --name=x img --a 0`" in messages[0]
    assert "ExecStart is now `docker run --name=x img --a 1`" in messages[0]
    assert "was not restarted" in messages[0]


def test_no_live_process_is_no_pass() -> None:
    snapshot = good_snapshot()
    snapshot.main_process = None
    found = [
        r for r in failures(check_sources(snapshot, GIB_KIB)) if r.check == Check.NOT_RESTARTED
    ]
    assert len(found) == 1
    assert "no live process" in found[0].message
