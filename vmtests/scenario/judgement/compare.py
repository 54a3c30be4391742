"""Compare snapshots across stages: S2 equals S1 on every durable field; switch and reboot
really happened (InvocationID changed on switch, boot ID changed on reboot)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vmtests.contracts.findings import Check, Reason
from vmtests.profiles import Profile
from vmtests.profiles.expectations import parse_module_banner
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.banners import features_claimed, module_banner_lines
from vmtests.scenario.judgement.checks import model_ids
from vmtests.scenario.judgement.results import CheckResult, failed, passed

# Set by systemd or the kernel per start; they differ between two starts of the same config.
VOLATILE_ENVIRONMENT = frozenset(
    {
        "INVOCATION_ID",
        "JOURNAL_STREAM",
        "SYSTEMD_EXEC_PID",
        "MAINPID",
        "MANAGERPID",
        "NOTIFY_SOCKET",
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "WATCHDOG_PID",
        "WATCHDOG_USEC",
        "HOSTNAME",
    }
)
_EXEC_VOLATILE = re.compile(r" ; (start_time|stop_time|pid|code|status)=[^;}]*")


@dataclass(frozen=True)
class FieldDiff:
    """One durable field that differs between two snapshots."""

    field: str
    before: Any
    after: Any


def _banner_texts(snapshot: Snapshot, profile: Profile | None) -> list[str]:
    """The banners of the current start, without timestamps or PIDs, sorted."""
    lines = snapshot.current_lines()
    texts = {f"{c.feature}:{c.detail}" for c in features_claimed(lines).values()}
    if profile is not None:
        for banner in (*profile.banners_present, *profile.banners_absent):
            if any(banner.pattern.search(line.message) for line in lines):
                texts.add(banner.name)
    return sorted(texts)


def _module_banner(snapshot: Snapshot) -> dict[str, str] | None:
    lines = module_banner_lines(snapshot.current_lines())
    try:
        return parse_module_banner(lines[-1].message) if lines else None
    except ValueError:
        return None


def durable_fields(snapshot: Snapshot, profile: Profile | None = None) -> dict[str, Any]:
    """The fields that must be identical after a reboot if the configuration is durable."""
    unit = snapshot.unit
    environment = {k: v for k, v in snapshot.environment.items() if k not in VOLATILE_ENVIRONMENT}
    return {
        "unit.ActiveState": unit.active_state,
        "unit.UnitFileState": unit.unit_file_state,
        "unit.FragmentPath": unit.fragment_path,
        "unit.DropInPaths": unit.drop_in_paths,
        "unit.ExecStart": _EXEC_VOLATILE.sub("", unit.prop("ExecStart")),
        "unit.Environment": unit.environment,
        "unit.files": unit.files,
        "process.argv": snapshot.argv,
        "process.environment": environment,
        "banners": _banner_texts(snapshot, profile),
        "module_banner": _module_banner(snapshot),
        "health.status": snapshot.health.status,
        "models": model_ids(snapshot),
        "hugepages.pools": {str(k): v for k, v in sorted(snapshot.hugepages.pools.items()) if v},
        "hugepages.unit": snapshot.hugepages.unit.unit_file_state,
        "kernel_cmdline": snapshot.kernel_cmdline,
        "container.stop_timeout": snapshot.container.stop_timeout if snapshot.container else None,
        "generation.current": snapshot.generations.get("/run/current-system"),
    }


def diff_snapshots(
    before: Snapshot, after: Snapshot, profile: Profile | None = None
) -> list[FieldDiff]:
    """The durable fields whose values differ between ``before`` and ``after``."""
    old, new = durable_fields(before, profile), durable_fields(after, profile)
    return [FieldDiff(key, old[key], new[key]) for key in old if old[key] != new[key]]


def check_durable(
    before: Snapshot, after: Snapshot, profile: Profile | None = None
) -> list[CheckResult]:
    """One result per durable field: equal before and after the reboot, or how it differs."""
    diffs = {d.field: d for d in diff_snapshots(before, after, profile)}
    results: list[CheckResult] = []
    for key in durable_fields(before, profile):
        diff = diffs.get(key)
        if diff is None:
            results.append(
                passed(after.label, Check.DURABLE, key, f"{before.label} == {after.label}")
            )
            continue
        results.append(
            failed(
                after.label,
                Check.DURABLE,
                key,
                Reason.CHANGED_ACROSS_REBOOT,
                f"{key} changed across the reboot: {before.label} had {_short(diff.before)}, "
                f"{after.label} has {_short(diff.after)}",
            )
        )
    # The module banner's digest covers args and environment: it must be stable by itself.
    old, new = _module_banner(before), _module_banner(after)
    digest_old, digest_new = (old or {}).get("digest"), (new or {}).get("digest")
    if digest_old and digest_old == digest_new:
        results.append(passed(after.label, Check.DURABLE, "digest", f"stable {digest_old}"))
    else:
        results.append(
            failed(
                after.label,
                Check.DURABLE,
                "digest",
                Reason.DIGEST_UNSTABLE,
                f"module banner digest {before.label}={digest_old} {after.label}={digest_new}",
            )
        )
    return results


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_rebooted(before: Snapshot, after: Snapshot) -> list[CheckResult]:
    """A new boot began between the snapshots; on NixOS it booted the switched generation."""
    stage = after.label
    results = [
        passed(stage, Check.REBOOT, "boot_id", f"{before.boot_id} -> {after.boot_id}")
        if before.boot_id and after.boot_id and before.boot_id != after.boot_id
        else failed(
            stage,
            Check.REBOOT,
            "boot_id",
            Reason.NO_NEW_BOOT,
            f"boot_id did not change ({before.boot_id} -> {after.boot_id}): no reboot happened",
        )
    ]
    switched = before.generations.get("/run/current-system")
    booted = after.generations.get("/run/booted-system")
    if switched is not None and booted is not None:
        results.append(
            passed(stage, Check.REBOOT, "booted-system", f"booted {booted}")
            if switched == booted
            else failed(
                stage,
                Check.REBOOT,
                "booted-system",
                Reason.WRONG_GENERATION_BOOTED,
                f"the reboot booted {booted}, not the switched generation {switched} "
                "(direct boot ignores the switch: useBootLoader?)",
            )
        )
    return results


def check_switched_system(after: Snapshot, expected: str | None) -> list[CheckResult]:
    """After a NixOS switch, the system that runs is ``expected`` (the toplevel pre-built into
    the image), not one the machine evaluated to something else; nothing when none is expected."""
    if expected is None:
        return []
    running = after.generations.get("/run/current-system")
    if running == expected:
        return [
            passed(
                after.label,
                Check.SWITCHED_SYSTEM,
                "current-system",
                f"runs the pre-built {running}",
            )
        ]
    return [
        failed(
            after.label,
            Check.SWITCHED_SYSTEM,
            "current-system",
            Reason.OTHER_SYSTEM_ACTIVATED,
            f"runs {running or 'no /run/current-system'}, not the pre-built {expected}: the "
            "switch activated another system than the one built on the host",
        )
    ]


def check_restarted(before: Snapshot, after: Snapshot) -> list[CheckResult]:
    """The switch restarted the serving unit: its InvocationID changed and it is active."""
    old, new = before.unit.invocation_id, after.unit.invocation_id
    if old and new and old != new and after.unit.active_state == "active":
        return [passed(after.label, Check.RESTART, "InvocationID", f"{old} -> {new}")]
    return [
        failed(
            after.label,
            Check.RESTART,
            "InvocationID",
            Reason.SWITCH_DID_NOT_RESTART,
            f"the switch did not restart {after.unit.name}: InvocationID {old or 'none'} -> "
            f"{new or 'none'}, ActiveState={after.unit.active_state}",
        )
    ]
