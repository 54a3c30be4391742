"""Check one snapshot against an expectation ``Profile``, and argv/env against the banners.

The comparisons themselves are ``vmtests.profiles.expectations`` (shared with the eval tier);
this module turns them into one ``CheckResult`` per expectation and stage, and adds context:
which stage, whether it held at the previous stage, and which file or environment set it.
Banners count only from the unit's current start in the current boot.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from vmtests.profiles import Profile
from vmtests.profiles.expectations import (
    Mismatch,
    match_args,
    match_environment,
    match_hugepages,
    match_module_banner,
    parse_module_banner,
)
from vmtests.scenario.banners import features_claimed, features_turned_on, module_banner_lines
from vmtests.scenario.results import CheckResult, failed, passed, stage_phrase
from vmtests.scenario.snapshot import JournalLine, Snapshot
from vmtests.scenario.sources import origin_of

SERVER_CHECK = "server.cache-config"  # the rows of vmtests.scenario.server_config


@dataclass(frozen=True)
class Row:
    """One expectation of a profile: the unit of the report's expectations x stages table."""

    check: str
    subject: str
    label: str
    kinds: frozenset[str]


def profile_rows(profile: Profile) -> list[Row]:
    """Every expectation of ``profile`` as a row, in profile order."""
    rows = [
        Row("profile.args", a.flag, f"argv has `{a}`", frozenset({"arg-missing", "arg-value"}))
        for a in profile.args_present
    ]
    rows += [
        Row("profile.args", f, f"argv lacks `{f}`", frozenset({"arg-forbidden"}))
        for f in profile.args_absent
    ]
    rows += [
        Row("profile.env", n, f"env `{n}={v}`", frozenset({"env-missing", "env-value"}))
        for n, v in profile.env_set.items()
    ]
    rows += [
        Row("profile.env", n, f"env lacks `{n}`", frozenset({"env-forbidden"}))
        for n in profile.env_absent
    ]
    rows += [
        Row("profile.banner", b.name, f"banner {b.name}", frozenset())
        for b in profile.banners_present
    ]
    rows += [
        Row("profile.banner", b.name, f"no banner {b.name}", frozenset())
        for b in profile.banners_absent
    ]
    rows.append(Row("profile.module-banner", "present", "module banner logged", frozenset()))
    rows += [
        Row("profile.module-banner", k, f"module banner `{k}={v}`", frozenset({"module-banner"}))
        for k, v in profile.module_banner.items()
    ]
    rows += [
        Row(SERVER_CHECK, k, f"server reports `{k}={v}`", frozenset())
        for k, v in profile.server_config.items()
    ]
    if profile.hugepages is not None:
        hp = profile.hugepages
        rows.append(
            Row(
                "profile.hugepages",
                "hugepages",
                f"{hp.count} x {hp.size}",
                frozenset({"hugepages"}),
            )
        )
    return rows


_ATTRIBUTABLE = frozenset({"profile.args", "profile.env"})


def _row_mismatches(row: Row, mismatches: list[Mismatch]) -> list[Mismatch]:
    """The mismatches that make ``row`` fail (hugepages mismatches name count/size)."""
    if row.check == "profile.hugepages":
        return [m for m in mismatches if m.kind == "hugepages"]
    return [m for m in mismatches if m.subject == row.subject and m.kind in row.kinds]


def _module_pairs(snapshot: Snapshot) -> tuple[dict[str, str] | None, str]:
    """The parsed module banner of the current start, or None and why not."""
    lines = module_banner_lines(snapshot.current_lines())
    if not lines:
        return None, "no module banner in this boot's log of the current start"
    try:
        return parse_module_banner(lines[-1].message), ""
    except ValueError as error:
        return None, str(error)


def _mismatches(profile: Profile, snapshot: Snapshot) -> list[Mismatch]:
    mismatches = match_args(profile, snapshot.argv) + match_environment(
        profile, snapshot.environment
    )
    pairs, _ = _module_pairs(snapshot)
    if pairs is not None:
        mismatches += match_module_banner(profile, pairs)
    if profile.hugepages is not None:
        size = profile.hugepages.size_kib
        mismatches += match_hugepages(profile, snapshot.hugepages.count(size), size)
    return mismatches


def _seen_earlier(
    pattern: re.Pattern[str], lines: Sequence[JournalLine], snapshot: Snapshot
) -> str:
    """Where a banner missing now was last seen: an earlier start or an earlier boot."""
    for line in reversed(lines):
        if pattern.search(line.message):
            if line.boot_id and line.boot_id != snapshot.boot_id:
                return (
                    f"; it was seen only in an earlier boot ({line.boot_id}): a stale banner "
                    "does not count"
                )
            return (
                "; it was seen only in an earlier start of the unit "
                f"(invocation {line.invocation_id})"
            )
    return ""


def check_profile(
    profile: Profile, snapshot: Snapshot, previous: Snapshot | None = None
) -> list[CheckResult]:
    """One result per expectation of ``profile`` at ``snapshot``'s stage.

    With ``previous`` (S1 when checking S2), a failure says whether the expectation held before
    and which file or environment set it then.
    """
    stage = snapshot.label
    mismatches = _mismatches(profile, snapshot)
    before = _mismatches(profile, previous) if previous is not None else []
    current = snapshot.current_lines()
    older = snapshot.older_lines()
    pairs, pairs_problem = _module_pairs(snapshot)
    source = _process_phrase(snapshot)
    results: list[CheckResult] = []
    for row in profile_rows(profile):
        if row.check == SERVER_CHECK:
            continue  # vmtests.scenario.server_config checks these
        if row.check == "profile.banner":
            results.append(_banner_result(profile, snapshot, row, current, older))
            continue
        if row.check == "profile.module-banner" and pairs is None:
            results.append(failed(stage, row.check, row.subject, pairs_problem))
            continue
        found = _row_mismatches(row, mismatches)
        if not found:
            results.append(passed(stage, row.check, row.subject, f"{row.label}: holds"))
            continue
        message = found[0].message
        if row.check in {"profile.args", "profile.env"}:
            message += f" (live {source})"
        if previous is not None:
            if not _row_mismatches(row, before):
                message += f"; it held {stage_phrase(previous.label)}"
            origin = origin_of(previous, row.subject) if row.check in _ATTRIBUTABLE else ""
            if origin:
                message += f"; {origin}"
        results.append(failed(stage, row.check, row.subject, message))
    return results


def _banner_result(
    profile: Profile,
    snapshot: Snapshot,
    row: Row,
    current: list[JournalLine],
    older: list[JournalLine],
) -> CheckResult:
    stage = snapshot.label
    present = {b.name: b for b in profile.banners_present}
    absent = {b.name: b for b in profile.banners_absent}
    expectation = present.get(row.subject) if row.label.startswith("banner") else None
    if expectation is not None:
        hits = [line for line in current if expectation.pattern.search(line.message)]
        if hits:
            return passed(stage, row.check, row.subject, f"logged: {hits[-1].message.strip()}")
        history = _seen_earlier(expectation.pattern, older, snapshot)
        return failed(
            stage,
            row.check,
            row.subject,
            f"profile {profile.name}: banner {row.subject} (/{expectation.pattern.pattern}/) is "
            f"missing from this boot's log of the current start of {snapshot.unit.name}" + history,
        )
    forbidden = absent[row.subject]
    hits = [line for line in current if forbidden.pattern.search(line.message)]
    if not hits:
        return passed(stage, row.check, row.subject, "not logged")
    return failed(
        stage,
        row.check,
        row.subject,
        f"profile {profile.name}: banner {row.subject} must not appear, but the current start "
        f"logged: {hits[-1].message.strip()}",
    )


def _process_phrase(snapshot: Snapshot) -> str:
    process = snapshot.process
    if process is None:
        return f"no serving process: {snapshot.unit.name} has MainPID {snapshot.unit.main_pid}"
    if process.origin == "container":
        return f"container {snapshot.container.get('name') if snapshot.container else '?'}"
    return f"pid {process.pid}, MainPID of {snapshot.unit.name}"


def check_consistency(snapshot: Snapshot) -> list[CheckResult]:
    """Every banner claiming a feature is on matches argv/env turning it on, and the reverse."""
    stage, check = snapshot.label, "consistency"
    if snapshot.process is None:
        return [failed(stage, check, "process", _process_phrase(snapshot))]
    turned_on = features_turned_on(snapshot.argv, snapshot.environment)
    claimed = features_claimed(snapshot.current_lines())
    results: list[CheckResult] = []
    for feature in sorted(set(turned_on) | set(claimed)):
        on, claim = turned_on.get(feature), claimed.get(feature)
        if on is not None and claim is not None and on.detail == claim.detail:
            results.append(passed(stage, check, feature, f"{claim.evidence} matches {on.evidence}"))
        elif on is None and claim is not None:
            results.append(
                failed(
                    stage,
                    check,
                    feature,
                    f"{claim.evidence} claims {feature} is on, but the live argv/env do not "
                    f"turn it on ({_process_phrase(snapshot)})",
                )
            )
        elif on is not None and claim is None:
            results.append(
                failed(
                    stage,
                    check,
                    feature,
                    f"{on.evidence} turns {feature} on, but no banner of the current start "
                    "claims it",
                )
            )
        elif on is not None and claim is not None:
            results.append(
                failed(
                    stage,
                    check,
                    feature,
                    f"{claim.evidence} says `{claim.detail}` but {on.evidence} says `{on.detail}`",
                )
            )
    if not results:
        results.append(passed(stage, check, "features", "no feature on, no banner claims one"))
    return results


def check_evidence(snapshot: Snapshot) -> list[CheckResult]:
    """Every part of the snapshot was read: a section that could not be collected (a tool
    missing from the PATH, a script that failed, a container that could not be inspected) is a
    failure that names it, never a check that passes for want of evidence."""
    stage = snapshot.label
    if not snapshot.errors:
        return [passed(stage, "snapshot.evidence", "snapshot", "every section was read")]
    return [
        failed(
            stage,
            "snapshot.evidence",
            "snapshot",
            f"the live state could not be read completely: {error}",
        )
        for error in snapshot.errors
    ]


def check_service(snapshot: Snapshot) -> list[CheckResult]:
    """The snapshot is complete (``check_evidence``), the unit is active with a main process,
    /health answers 200, /v1/models lists a model."""
    stage, unit = snapshot.label, snapshot.unit
    results = [
        *check_evidence(snapshot),
        passed(stage, "service.active", unit.name, "active")
        if unit.active_state == "active"
        else failed(
            stage, "service.active", unit.name, f"{unit.name} is {unit.active_state or 'unknown'}"
        ),
    ]
    health = snapshot.health
    results.append(
        passed(stage, "service.health", health.url, "200")
        if health.status == 200
        else failed(
            stage,
            "service.health",
            health.url,
            f"GET {health.url} gave {health.status or health.error}",
        )
    )
    results.append(_models_result(snapshot))
    return results


def _models_result(snapshot: Snapshot) -> CheckResult:
    stage, models = snapshot.label, snapshot.models
    if models.status != 200:
        return failed(
            stage,
            "service.models",
            models.url,
            f"GET {models.url} gave {models.status or models.error}",
        )
    try:
        ids = [entry["id"] for entry in json.loads(models.body)["data"]]
    except (ValueError, KeyError, TypeError):
        return failed(stage, "service.models", models.url, f"not a model list: {models.body[:200]}")
    if not ids:
        return failed(stage, "service.models", models.url, "the model list is empty")
    return passed(stage, "service.models", models.url, f"serves {', '.join(ids)}")


def model_ids(snapshot: Snapshot) -> list[str]:
    """The model IDs ``/v1/models`` listed (empty when it did not answer with a list)."""
    try:
        return sorted(str(entry["id"]) for entry in json.loads(snapshot.models.body)["data"])
    except (ValueError, KeyError, TypeError):
        return []
