"""Check one snapshot against an expectation ``Profile``, and argv/env against the banners;
``evaluate_stage`` runs every single-snapshot check.

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

from vmtests.contracts.findings import Check, Reason
from vmtests.profiles import Profile
from vmtests.profiles.expectations import (
    Mismatch,
    match_args,
    match_environment,
    match_hugepages,
    match_module_banner,
    parse_module_banner,
)
from vmtests.scenario.collection.snapshot import JournalLine, Snapshot
from vmtests.scenario.judgement.banners import (
    features_claimed,
    features_turned_on,
    module_banner_lines,
)
from vmtests.scenario.judgement.card import check_card
from vmtests.scenario.judgement.provenance import check_provenance
from vmtests.scenario.judgement.restarts import check_restarts
from vmtests.scenario.judgement.results import CheckResult, failed, passed, stage_phrase
from vmtests.scenario.judgement.server_config import check_server_config
from vmtests.scenario.judgement.sources import check_sources, origin_of


@dataclass(frozen=True)
class Row:
    """One expectation of a profile: the unit of the report's expectations x stages table."""

    check: Check
    subject: str
    label: str
    kinds: frozenset[Reason]


def profile_rows(profile: Profile) -> list[Row]:
    """Every expectation of ``profile`` as a row, in profile order."""
    rows = [
        Row(Check.PROFILE_ARGS, a.flag, f"argv has `{a}`", _PRESENT_ARG)
        for a in profile.args_present
    ]
    rows += [
        Row(Check.PROFILE_ARGS, f, f"argv lacks `{f}`", frozenset({Reason.ARG_FORBIDDEN}))
        for f in profile.args_absent
    ]
    rows += [
        Row(Check.PROFILE_ENV, n, f"env `{n}={v}`", _SET_ENV) for n, v in profile.env_set.items()
    ]
    rows += [
        Row(Check.PROFILE_ENV, n, f"env lacks `{n}`", frozenset({Reason.ENV_FORBIDDEN}))
        for n in profile.env_absent
    ]
    rows += [
        Row(Check.PROFILE_BANNER, b.name, f"banner {b.name}", frozenset())
        for b in profile.banners_present
    ]
    rows += [
        Row(Check.PROFILE_BANNER, b.name, f"no banner {b.name}", frozenset())
        for b in profile.banners_absent
    ]
    rows.append(Row(Check.PROFILE_MODULE_BANNER, "present", "module banner logged", frozenset()))
    rows += [
        Row(Check.PROFILE_MODULE_BANNER, k, f"module banner `{k}={v}`", _BANNER_VALUE)
        for k, v in profile.module_banner.items()
    ]
    rows += [
        Row(Check.SERVER_CACHE_CONFIG, k, f"server reports `{k}={v}`", frozenset())
        for k, v in profile.server_config.items()
    ]
    if profile.hugepages is not None:
        hp = profile.hugepages
        rows.append(Row(Check.PROFILE_HUGEPAGES, "hugepages", f"{hp.count} x {hp.size}", _PAGES))
    return rows


_PRESENT_ARG = frozenset({Reason.ARG_MISSING, Reason.ARG_VALUE})
_SET_ENV = frozenset({Reason.ENV_MISSING, Reason.ENV_VALUE})
_BANNER_VALUE = frozenset({Reason.MODULE_BANNER_VALUE})
_PAGES = frozenset({Reason.HUGEPAGES_COUNT, Reason.HUGEPAGES_SIZE})
_ATTRIBUTABLE = frozenset({Check.PROFILE_ARGS, Check.PROFILE_ENV})


def _row_mismatches(row: Row, mismatches: list[Mismatch]) -> list[Mismatch]:
    """The mismatches that make ``row`` fail (hugepages mismatches name count/size)."""
    if row.check == Check.PROFILE_HUGEPAGES:
        return [m for m in mismatches if m.kind in row.kinds]
    return [m for m in mismatches if m.subject == row.subject and m.kind in row.kinds]


@dataclass(frozen=True)
class ModuleBanner:
    """The module banner of the current start: its pairs, or why there are none."""

    pairs: dict[str, str] | None
    reason: Reason = Reason.MODULE_BANNER_MISSING
    problem: str = ""


def _module_pairs(snapshot: Snapshot) -> ModuleBanner:
    """The parsed module banner of the current start, or why there is none."""
    lines = module_banner_lines(snapshot.current_lines())
    if not lines:
        return ModuleBanner(
            None, problem="no module banner in this boot's log of the current start"
        )
    try:
        return ModuleBanner(parse_module_banner(lines[-1].message))
    except ValueError as error:
        return ModuleBanner(None, Reason.MODULE_BANNER_MALFORMED, str(error))


def _mismatches(profile: Profile, snapshot: Snapshot) -> list[Mismatch]:
    mismatches = match_args(profile, snapshot.argv) + match_environment(
        profile, snapshot.environment
    )
    pairs = _module_pairs(snapshot).pairs
    if pairs is not None:
        mismatches += match_module_banner(profile, pairs)
    if profile.hugepages is not None:
        size = profile.hugepages.size_kib
        mismatches += match_hugepages(profile, snapshot.hugepages.count(size), size)
    return mismatches


def _seen_earlier(
    pattern: re.Pattern[str], lines: Sequence[JournalLine], snapshot: Snapshot
) -> tuple[Reason, str]:
    """Why a banner is missing now: never seen, or seen in an earlier start or an earlier boot
    (and a phrase that says where)."""
    for line in reversed(lines):
        if pattern.search(line.message):
            if line.boot_id and line.boot_id != snapshot.boot_id:
                return Reason.BANNER_STALE, (
                    f"; it was seen only in an earlier boot ({line.boot_id}): a stale banner "
                    "does not count"
                )
            return Reason.BANNER_EARLIER_START, (
                "; it was seen only in an earlier start of the unit "
                f"(invocation {line.invocation_id})"
            )
    return Reason.BANNER_MISSING, ""


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
    banner = _module_pairs(snapshot)
    source = _process_phrase(snapshot)
    results: list[CheckResult] = []
    for row in profile_rows(profile):
        if row.check == Check.SERVER_CACHE_CONFIG:
            continue  # vmtests.scenario.judgement.server_config checks these
        if row.check == Check.PROFILE_BANNER:
            results.append(_banner_result(profile, snapshot, row, current, older))
            continue
        if row.check == Check.PROFILE_MODULE_BANNER and banner.pairs is None:
            results.append(failed(stage, row.check, row.subject, banner.reason, banner.problem))
            continue
        found = _row_mismatches(row, mismatches)
        if not found:
            results.append(passed(stage, row.check, row.subject, f"{row.label}: holds"))
            continue
        message = found[0].message
        if row.check in _ATTRIBUTABLE:
            message += f" (live {source})"
        if previous is not None:
            if not _row_mismatches(row, before):
                message += f"; it held {stage_phrase(previous.label)}"
            origin = origin_of(previous, row.subject) if row.check in _ATTRIBUTABLE else ""
            if origin:
                message += f"; {origin}"
        results.append(failed(stage, row.check, row.subject, found[0].kind, message))
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
            where = f" (in the {hits[-1].source})" if hits[-1].source else ""
            message = f"logged{where}: {hits[-1].message.strip()}"
            return passed(stage, row.check, row.subject, message)
        reason, history = _seen_earlier(expectation.pattern, older, snapshot)
        return failed(
            stage,
            row.check,
            row.subject,
            reason,
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
        Reason.BANNER_FORBIDDEN,
        f"profile {profile.name}: banner {row.subject} must not appear, but the current start "
        f"logged: {hits[-1].message.strip()}",
    )


def _process_phrase(snapshot: Snapshot) -> str:
    if snapshot.container is not None:
        return f"container {snapshot.container.name}"
    process = snapshot.main_process
    if process is None:
        return f"no serving process: {snapshot.unit.name} has MainPID {snapshot.unit.main_pid}"
    return f"pid {process.pid}, MainPID of {snapshot.unit.name}"


def check_consistency(snapshot: Snapshot) -> list[CheckResult]:
    """Every banner claiming a feature is on matches argv/env turning it on, and the reverse."""
    stage, check = snapshot.label, Check.CONSISTENCY
    if snapshot.server is None:
        return [failed(stage, check, "process", Reason.NO_PROCESS, _process_phrase(snapshot))]
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
                    Reason.CLAIM_WITHOUT_SWITCH,
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
                    Reason.SWITCH_WITHOUT_CLAIM,
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
                    Reason.CLAIM_DETAIL_DIFFERS,
                    f"{claim.evidence} says `{claim.detail}` but {on.evidence} says `{on.detail}`",
                )
            )
    if not results:
        results.append(passed(stage, check, "features", "no feature on, no banner claims one"))
    return results


def check_evidence(snapshot: Snapshot) -> list[CheckResult]:
    """Every part of the snapshot was read: a section that could not be collected (a tool
    missing from the PATH, a script that failed, a container that could not be inspected) is a
    failure that names it, never a check that passes for want of evidence. So is journald's
    ``Suppressed N messages from <unit>`` about the unit's current start: its rate limit dropped
    lines that may have held banners (the snapshot then also read the container's own log)."""
    stage = snapshot.label
    results = [
        failed(
            stage,
            Check.SNAPSHOT_EVIDENCE,
            "snapshot",
            Reason.INCOMPLETE_SNAPSHOT,
            f"the live state could not be read completely: {error}",
        )
        for error in snapshot.errors
    ]
    results += [
        failed(
            stage,
            Check.SNAPSHOT_EVIDENCE,
            f"journal of {snapshot.unit.name}",
            Reason.JOURNAL_SUPPRESSED,
            f"journald dropped {line.dropped} lines of {snapshot.unit.name} in its current start "
            f"({line.message.strip()!r}): the unit logged faster than its rate limit "
            "(journald.conf RateLimitIntervalSec=/RateLimitBurst=, or the unit's "
            "LogRateLimitIntervalSec=/LogRateLimitBurst=), so banners may be missing from its "
            "journal; the container's own log was read for them as well",
        )
        for line in snapshot.suppressed()
    ]
    return results or [passed(stage, Check.SNAPSHOT_EVIDENCE, "snapshot", "every section was read")]


def check_service(snapshot: Snapshot) -> list[CheckResult]:
    """The snapshot is complete (``check_evidence``), the unit is active with a main process
    and neither it nor its container restarted on its own (``check_restarts``), /health
    answers 200, /v1/models lists a model."""
    stage, unit = snapshot.label, snapshot.unit
    results = [
        *check_evidence(snapshot),
        passed(stage, Check.SERVICE_ACTIVE, unit.name, "active")
        if unit.active_state == "active"
        else failed(
            stage,
            Check.SERVICE_ACTIVE,
            unit.name,
            Reason.NOT_ACTIVE,
            f"{unit.name} is {unit.active_state or 'unknown'}",
        ),
        *check_restarts(snapshot),
    ]
    health = snapshot.health
    results.append(
        passed(stage, Check.SERVICE_HEALTH, health.url, "200")
        if health.status == 200
        else failed(
            stage,
            Check.SERVICE_HEALTH,
            health.url,
            Reason.NOT_ANSWERING,
            f"GET {health.url} gave {health.status or health.error}",
        )
    )
    results.append(_models_result(snapshot))
    return results


def unauthorized_message(url: str, api_key_file: str) -> str:
    """What a 401 from a ``/v1`` path means, and what to do about it."""
    # Worded so that redaction (redact.py) leaves it whole: no ``--flag word`` or ``NAME=x``.
    if api_key_file:
        return (
            f"GET {url} gave 401 Unauthorized with the API key in {api_key_file}: the server "
            "expects another key (vLLM's `--api-key` option, or `$VLLM_API_KEY` in the "
            "container)"
        )
    return (
        f"GET {url} gave 401 Unauthorized: the server requires an API key (vLLM's `--api-key` "
        "option or `$VLLM_API_KEY`, which tt-inference-server sets from VLLM_API_KEY or "
        "JWT_SECRET); give the file on the host that holds it as the setting api_key_file "
        "(a target option, or in --host-config)"
    )


def _models_result(snapshot: Snapshot) -> CheckResult:
    stage, models = snapshot.label, snapshot.models
    if models.status == 401:
        message = unauthorized_message(models.url, snapshot.api_key_file)
        return failed(stage, Check.SERVICE_MODELS, models.url, Reason.UNAUTHORIZED, message)
    if models.status != 200:
        return failed(
            stage,
            Check.SERVICE_MODELS,
            models.url,
            Reason.NOT_ANSWERING,
            f"GET {models.url} gave {models.status or models.error}",
        )
    try:
        ids = [entry["id"] for entry in json.loads(models.body)["data"]]
    except (ValueError, KeyError, TypeError):
        return failed(
            stage,
            Check.SERVICE_MODELS,
            models.url,
            Reason.NOT_A_MODEL_LIST,
            f"not a model list: {models.body[:200]}",
        )
    if not ids:
        return failed(
            stage, Check.SERVICE_MODELS, models.url, Reason.NO_MODEL, "the model list is empty"
        )
    return passed(stage, Check.SERVICE_MODELS, models.url, f"serves {', '.join(ids)}")


def model_ids(snapshot: Snapshot) -> list[str]:
    """The model IDs ``/v1/models`` listed (empty when it did not answer with a list)."""
    try:
        return sorted(str(entry["id"]) for entry in json.loads(snapshot.models.body)["data"])
    except (ValueError, KeyError, TypeError):
        return []


def evaluate_stage(
    profile: Profile, snapshot: Snapshot, previous: Snapshot | None = None
) -> list[CheckResult]:
    """Every single-snapshot check: service, profile, the server's own config, consistency,
    runtime-only sources and the provenance of every serving-relevant live value, the card."""
    size = profile.hugepages.size_kib if profile.hugepages else None
    relevant = [*profile.env_set, *profile.env_absent]
    return [
        *check_service(snapshot),
        *check_profile(profile, snapshot, previous),
        *check_server_config(profile, snapshot),
        *check_consistency(snapshot),
        *check_sources(snapshot, size, relevant),
        *check_provenance(snapshot, relevant),
        *check_card(snapshot),
    ]
