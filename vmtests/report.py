"""Reports of a scenario run: JSON, JUnit XML, a Markdown summary and the console log per boot.

Every file is written atomically (a temporary file in the same directory, then ``os.replace``),
so a report dir never holds a half-written file, and callers write reports in ``finally`` so
that a failed or interrupted run keeps its evidence. Snapshots are already redacted; free text
(messages, errors) is redacted again here on the way out.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from vmtests.scenario.collection.redact import redact_text
from vmtests.scenario.controls.control import ControlOutcome
from vmtests.scenario.judgement.checks import profile_rows
from vmtests.scenario.judgement.results import CheckResult
from vmtests.scenario.judgement.seen import live_state, seen, statement_lines
from vmtests.scenario.judgement.server_config import describe
from vmtests.scenario.runner.scenario import CHECK, Kind, ScenarioResult
from vmtests.scenario.runner.versions import VersionTable, markdown_lines

STAGES = ("S0", "S1", "S2")
TIMING_GROUPS = {
    "boot": ("boot",),
    "switch": ("prepare base", "deploy", "switch"),
    "reboot": ("reboot",),
    "snapshots": ("snapshot S0", "snapshot S1", "snapshot S2", "snapshot check"),
    "checks": ("checks S0", "checks S1", "checks S2", "compare S1/S2", "checks"),
    "preflight": ("preflight", "record generation", "versions", "nixos versions"),
    "evidence": ("evidence S1", "evidence S2", "evidence check", "evidence error"),
    "recovery": ("recovery", "snapshot rollback", "checks rollback"),
}


class ConsoleCapture(Protocol):
    """What a QEMU machine offers: the serial console log of each boot."""

    @property
    def boot_index(self) -> int:
        """Index of the running boot."""

    def console_log(self, boot_index: int) -> Path:
        """Path of the console log of boot ``boot_index``."""


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def timing_breakdown(result: ScenarioResult) -> dict[str, float]:
    """Wall time per step group (boot, switch, reboot, snapshots, checks) and the driver's share."""
    groups = {
        group: round(sum(result.steps.get(step, 0.0) for step in steps), 3)
        for group, steps in TIMING_GROUPS.items()
    }
    wall = result.wall_seconds
    groups["total"] = round(wall, 3)
    groups["driver"] = round(result.meter.total_seconds, 3)
    groups["driver_share"] = round(result.meter.total_seconds / wall, 3) if wall else 0.0
    groups["driver_overhead_estimate"] = round(result.meter.overhead_estimate(), 3)
    return groups


def scenario_data(result: ScenarioResult) -> dict[str, Any]:
    """The JSON document of one scenario run."""
    return {
        "profile": result.profile.name,
        "profile_source": str(result.profile.source),
        "target": result.target,
        "switch": result.switch,
        "expected_system": result.expected_system,
        "switched_system": result.switched_system,
        "accelerator": result.accelerator,
        "status": result.status,
        "ok": result.ok,
        "error": redact_text(result.error),
        "steps": {name: round(seconds, 3) for name, seconds in result.steps.items()},
        "timings": timing_breakdown(result),
        "driver": result.meter.to_dict(),
        "checks": [_redacted(check) for check in result.checks],
        "failures": [_redacted(check) for check in result.failures],
        "diffs": [{"field": d.field, "S1": d.before, "S2": d.after} for d in result.diffs],
        "snapshots": {label: snap.to_dict() for label, snap in result.snapshots.items()},
        "console_logs": result.console_logs,
        "stopped_at": result.stopped_at,
        "evidence": {
            stage: [evidence_path(stage, name) for name in parts]
            for stage, parts in result.evidence.items()
        },
        "kind": result.kind,
        "settings": result.settings.to_dict(),
        "preflight": [_redacted(item) for item in result.preflight],
        "versions": result.versions,
        "version_table": result.version_table.to_dict(),
        "generation": result.generation.to_dict() if result.generation else None,
        "recovery": result.recovery.to_dict() if result.recovery else None,
        **(_check_data(result) if result.kind == Kind.CHECK else {}),
    }


def _check_data(result: ScenarioResult) -> dict[str, Any]:
    """A check's expected and seen value per expectation, and the live state."""
    snapshot = result.snapshots.get(CHECK)
    if snapshot is None:
        return {}
    return {
        "expected_and_seen": [
            {"check": row.check, "subject": row.subject, "expected": row.label,
             "seen": seen(result.profile, row, snapshot)}
            for row in profile_rows(result.profile)
        ],
        "live_state": dict(live_state(snapshot)),
        "statements": statement_lines(snapshot),
    }  # fmt: skip


def evidence_path(stage: str, name: str) -> str:
    """Where one part of a stage's evidence lands, relative to the report directory."""
    return f"evidence/{stage}/{name}.txt"


def _redacted(check: CheckResult) -> dict[str, Any]:
    data = check.to_dict()
    data["message"] = redact_text(check.message)
    return data


def junit_xml(result: ScenarioResult, controls: Sequence[ControlOutcome] = ()) -> str:
    """JUnit XML: one test case per check result and per negative control."""
    suite = ET.Element("testsuite", name=f"vmtests.scenario.{result.profile.name}")
    failures = 0
    for check in result.checks:
        scope = "base " if check.base else ""
        case = ET.SubElement(
            suite, "testcase", classname=f"{check.stage}.{scope}{check.check}", name=check.subject
        )
        if check.failed:
            failures += 1
            ET.SubElement(
                case, "failure", message=redact_text(check.message)[:500]
            ).text = redact_text(check.message)
        elif not check.ok:
            ET.SubElement(case, "system-out").text = "informational: " + check.message
    for outcome in controls:
        case = ET.SubElement(suite, "testcase", classname="negative-control", name=outcome.name)
        if not outcome.detected:
            failures += 1
            ET.SubElement(case, "failure", message=f"{outcome.name} was not detected")
        else:
            ET.SubElement(case, "system-out").text = redact_text(outcome.message)
    if result.error:
        case = ET.SubElement(suite, "testcase", classname="scenario", name="run")
        ET.SubElement(case, "error", message=redact_text(result.error)[:500])
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("errors", "1" if result.error else "0")
    suite.set("time", f"{result.wall_seconds:.3f}")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def _cell(results: list[CheckResult]) -> str:
    if not results:
        return "-"
    return "pass" if all(r.ok for r in results) else "FAIL"


def markdown_summary(result: ScenarioResult, controls: Sequence[ControlOutcome] = ()) -> str:
    """A human-readable summary: expectations x S0/S1/S2 (or, for a check, expected and seen),
    other failures, diffs, the host's settings, preflight and recovery, timings."""
    if result.kind == Kind.CHECK:
        return _check_markdown(result)
    verdict = "PASSED" if result.ok else f"FAILED ({result.status})"
    lines = [
        f"# vmtests persistence scenario: {result.profile.name} on {result.target}: {verdict}",
        "",
        f"Switch: {result.switch}",
        "",
    ]
    for line in (system_line(result), accelerator_line(result)):
        if line:
            lines += [line, ""]
    lines += [*version_lines(result.version_table), ""]
    lines += [
        "S0 is the base boot (the target profile is not expected to hold there), S1 is after "
        "the switch, S2 after the reboot.",
        "",
        "| expectation | S0 | S1 | S2 |",
        "| --- | --- | --- | --- |",
    ]
    by_key: dict[tuple[str, str, str], list[CheckResult]] = {}
    for check in result.checks:
        if not check.base:
            by_key.setdefault((check.stage, check.check, check.subject), []).append(check)
    for row in profile_rows(result.profile):
        cells = [_cell(by_key.get((stage, row.check, row.subject), [])) for stage in STAGES]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    keys = list(result.profile.server_config)
    if keys:
        lines += [
            "",
            "## Cache config reported by the running server",
            "",
            "From `vllm:cache_config_info` on /metrics and the engine config line.",
            "",
            "| key | S0 | S1 | S2 |",
            "| --- | --- | --- | --- |",
        ]
        reported = {stage: describe(snapshot, keys) for stage, snapshot in result.snapshots.items()}
        for key in keys:
            cells = [reported.get(stage, {}).get(key, "-") for stage in STAGES]
            lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    lines += restart_table(result)
    lines += ["", "## Failed checks", ""]
    lines += [f"- {redact_text(str(check))}" for check in result.failures] or ["- none"]
    if result.error:
        lines += ["", f"**Run error:** {redact_text(result.error)}"]
    if result.stopped_at:
        lines += [
            "",
            f"**Stopped after {result.stopped_at}:** it failed, so the machine was not "
            "rebooted (a reboot cannot make a switch that did not take persist).",
        ]
    if result.evidence:
        lines += ["", "## Evidence", ""]
        lines += [
            f"- {stage}: " + ", ".join(f"[{name}]({evidence_path(stage, name)})" for name in parts)
            for stage, parts in result.evidence.items()
        ]
    lines += ["", "## S1 / S2 differences in durable fields", ""]
    lines += [f"- `{d.field}`: S1 `{d.before!r}` / S2 `{d.after!r}`" for d in result.diffs] or [
        "- none"
    ]
    lines += _first_run_sections(result)
    timings = timing_breakdown(result)
    lines += ["", "## Wall time by step", "", "| step | seconds |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in timings.items()]
    if controls:
        lines += ["", *detection_table(controls)]
    return "\n".join(lines) + "\n"


def restart_table(result: ScenarioResult) -> list[str]:
    """The restart evidence per stage (``vmtests.scenario.judgement.restarts``): the unit's
    ``NRestarts`` and the container's restart count and start; none without snapshots."""
    if not result.snapshots:
        return []
    units, containers = [], []
    for stage in STAGES:
        snapshot = result.snapshots.get(stage)
        count = snapshot.unit.n_restarts if snapshot is not None else None
        units.append("-" if snapshot is None else "?" if count is None else str(count))
        container = snapshot.container if snapshot is not None else None
        containers.append(
            "-" if container is None else f"{container.restart_count} ({container.started_at})"
        )
    return [
        "",
        "## Restarts on their own",
        "",
        "Since the switch or the boot started the unit: systemd's `NRestarts`, and the "
        "container engine's restart count (the container's start).",
        "",
        "| restarts | S0 | S1 | S2 |",
        "| --- | --- | --- | --- |",
        "| unit (`NRestarts`) | " + " | ".join(units) + " |",
        "| container | " + " | ".join(containers) + " |",
    ]


def system_line(result: ScenarioResult) -> str:
    """Which NixOS system ran after the switch, and whether it is the pre-built one ("" when
    neither is known: not a NixOS machine)."""
    switched, expected = result.switched_system, result.expected_system
    if expected is None:
        return f"System after the switch: {switched}" if switched else ""
    if switched == expected:
        return f"System after the switch: {switched} (the pre-built target)"
    seen = switched or "unknown (no snapshot after the switch)"
    return f"System after the switch: {seen}, **not** the pre-built target {expected}"


def accelerator_line(result: ScenarioResult) -> str:
    """Which accelerator ran the guest, which was asked for and why ("" for other machines)."""
    accelerator = result.accelerator
    if not accelerator:
        return ""
    used = accelerator.get("used") or "none (QEMU did not start)"
    return (
        f"Accelerator: {used} (asked for {accelerator.get('requested', '?')}: "
        f"{accelerator.get('why', '')})"
    )


def machine_acceleration(machine: object) -> dict[str, str]:
    """``acceleration`` of a QEMU machine (``vmtests.driver.qemu.QemuMachine``); {} otherwise."""
    inner = getattr(machine, "inner", machine)
    acceleration = getattr(inner, "acceleration", None)
    return dict(acceleration) if isinstance(acceleration, dict) else {}


def version_lines(table: VersionTable) -> list[str]:
    """The version table (``vmtests.scenario.runner.versions``), redacted like all free text."""
    return [redact_text(line) for line in markdown_lines(table)]


def _escape(text: str) -> str:
    return redact_text(text).replace("|", "\\|").replace("\n", " ")


def _first_run_sections(result: ScenarioResult) -> list[str]:
    """The host's settings, what the preflight found and what was done after a failure."""
    lines = ["", "## Host settings", "", "| setting | value | from |", "| --- | --- | --- |"]
    lines += [
        f"| {name} | {_escape(value)} | {source} |"
        for name, value, source in result.settings.describe()
    ]
    if result.preflight:
        lines += ["", "## Preflight", "", "| item | holds | found |", "| --- | --- | --- |"]
        lines += [
            f"| {item.subject} | {'yes' if item.ok else f'**NO** ({item.reason})'} | "
            f"{_escape(item.message)} |"
            for item in result.preflight
        ]
    if result.generation is not None:
        lines += [
            "",
            "## Going back",
            "",
            f"Before the switch the machine ran {result.generation.description}. The command "
            "that goes back (as root on the machine):",
            "",
            f"    {result.generation.rollback_command}",
        ]
    if result.recovery is not None:
        lines += ["", f"**After the failure ({result.recovery.action}):** "
                      f"{redact_text(result.recovery.message)}"]  # fmt: skip
    return lines


def _check_markdown(result: ScenarioResult) -> str:
    """``vmtests check``: every expectation with what was expected and what was seen."""
    verdict = "CONFORMS" if result.ok else f"DOES NOT CONFORM ({result.status})"
    lines = [
        f"# vmtests check: {result.profile.name} on {result.target}: {verdict}",
        "",
        f"Read-only: one snapshot, no switch, no reboot, no restart. Deployed first: "
        f"{result.switch}.",
        "",
        *version_lines(result.version_table),
    ]
    snapshot = result.snapshots.get(CHECK)
    if snapshot is not None:
        by_key: dict[tuple[str, str], list[CheckResult]] = {}
        for check in result.checks:
            by_key.setdefault((check.check, check.subject), []).append(check)
        lines += ["", "## Expectations", ""]
        lines += ["| expectation | expected | seen | check |", "| --- | --- | --- | --- |"]
        for row in profile_rows(result.profile):
            cell = _cell(by_key.get((row.check, row.subject), []))
            shown = _escape(seen(result.profile, row, snapshot))
            lines.append(f"| {row.subject} | {_escape(row.label)} | {shown} | {cell} |")
        lines += ["", "## Live state", "", "| what | seen |", "| --- | --- |"]
        lines += [f"| {what} | {_escape(value)} |" for what, value in live_state(snapshot)]
        lines += ["", "## What the current start says about its configuration", ""]
        lines += [f"- {_escape(text)}" for text in statement_lines(snapshot)] or ["- nothing"]
    lines += ["", "## Failed checks", ""]
    lines += [f"- {redact_text(str(check))}" for check in result.failures] or ["- none"]
    if result.error:
        lines += ["", f"**Run error:** {redact_text(result.error)}"]
    if result.evidence:
        lines += ["", "## Evidence", ""]
        lines += [
            f"- {stage}: " + ", ".join(f"[{name}]({evidence_path(stage, name)})" for name in parts)
            for stage, parts in result.evidence.items()
        ]
    lines += _first_run_sections(result)
    return "\n".join(lines) + "\n"


def write_prometheus(result: ScenarioResult, path: Path) -> Path:
    """The check's verdict and each check's result in the node_exporter textfile-collector
    format (``prometheus_client``'s ``write_to_textfile``, atomic), for a host that checks
    itself from a timer: ``vmtests_check_ok`` (1 conforms, 0 not), ``vmtests_check_passed``
    per check and subject, ``vmtests_check_failures`` and ``vmtests_check_timestamp_seconds``."""
    registry = CollectorRegistry()
    labels = {"profile": result.profile.name, "target": result.target.partition("?")[0]}
    names = list(labels)
    verdict = Gauge("vmtests_check_ok", "1 when the target conforms to the profile", names,
                    registry=registry)  # fmt: skip
    verdict.labels(**labels).set(1 if result.ok else 0)
    failures = Gauge("vmtests_check_failures", "checks that failed", names, registry=registry)
    failures.labels(**labels).set(len(result.failures))
    stamp = Gauge("vmtests_check_timestamp_seconds", "when the check ran", names,
                  registry=registry)  # fmt: skip
    stamp.labels(**labels).set(time.time())
    passed = Gauge(
        "vmtests_check_passed",
        "1 when the check held (informational results count as held)",
        [*names, "check", "subject"],
        registry=registry,
    )
    for check in result.checks:
        held = passed.labels(**labels, check=check.check, subject=check.subject)
        held.set(0 if check.failed else 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)
    return path


def detection_table(controls: Sequence[ControlOutcome]) -> list[str]:
    """The negative controls' detection table as Markdown lines."""
    lines = [
        "## Negative controls",
        "",
        "| control | detected | finding | message |",
        "| --- | --- | --- | --- |",
    ]
    for outcome in controls:
        message = redact_text(outcome.message).replace("|", "\\|")
        detected = "yes" if outcome.detected else "**NO**"
        finding = str(outcome.finds) if outcome.finds else "none (false-alarm control)"
        lines.append(f"| {outcome.name} | {detected} | {finding} | {message} |")
    return lines


def copy_console_logs(machine: object, directory: Path) -> list[str]:
    """Copy the serial console log of every boot of ``machine`` (if it has them)."""
    inner = getattr(machine, "inner", machine)
    if not hasattr(inner, "console_log") or not hasattr(inner, "boot_index"):
        return []
    capture: ConsoleCapture = inner
    copied: list[str] = []
    for index in range(capture.boot_index + 1):
        source = capture.console_log(index)
        if source.exists():
            destination = directory / f"console-boot-{index}.log"
            directory.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
            copied.append(destination.name)
    return copied


def write_scenario_report(
    result: ScenarioResult,
    directory: Path,
    machine: object | None = None,
    controls: Sequence[ControlOutcome] = (),
) -> dict[str, Path]:
    """Write report.json, junit.xml, summary.md and the console logs into ``directory``."""
    if machine is not None:
        result.console_logs = copy_console_logs(machine, directory)
        result.accelerator = machine_acceleration(machine)
    data = scenario_data(result)
    if controls:
        data["controls"] = [outcome.to_dict() for outcome in controls]
    for stage, parts in result.evidence.items():
        for name, text in parts.items():
            write_atomic(directory / evidence_path(stage, name), redact_text(text))
    return {
        "json": write_atomic(directory / "report.json", json.dumps(data, indent=2, default=str)),
        "junit": write_atomic(directory / "junit.xml", junit_xml(result, controls)),
        "markdown": write_atomic(directory / "summary.md", markdown_summary(result, controls)),
    }


def write_controls_report(
    controls: Sequence[ControlOutcome],
    false_alarms: Sequence[CheckResult],
    directory: Path,
    correct: ControlOutcome | None = None,
) -> dict[str, Path]:
    """Write the negative controls' JSON and Markdown (detection table and false alarms); the
    JSON keeps every outcome's snapshot, the correct configuration's (``correct``) too."""
    data = {
        "controls": [outcome.to_dict() for outcome in controls],
        "false_alarms": [_redacted(check) for check in false_alarms],
        "all_detected": all(outcome.detected for outcome in controls),
        "correct_configuration": correct.to_dict() if correct else None,
    }
    lines = [*detection_table(controls), "", "## False alarms on the correct configuration", ""]
    lines += [f"- {redact_text(str(check))}" for check in false_alarms] or ["- none"]
    return {
        "json": write_atomic(directory / "controls.json", json.dumps(data, indent=2)),
        "markdown": write_atomic(directory / "controls.md", "\n".join(lines) + "\n"),
    }
