"""Unit tests of the report writers: JSON, JUnit XML, Markdown; atomic; kept on failure."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

from scenario_support import good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.contracts.status import RunStatus
from vmtests.profiles import load_profile
from vmtests.report import (
    markdown_summary,
    timing_breakdown,
    write_atomic,
    write_controls_report,
    write_scenario_report,
)
from vmtests.scenario.controls.control import ControlOutcome
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.judgement.compare import diff_snapshots
from vmtests.scenario.runner.scenario import ScenarioResult

CFX = load_profile("cfx-llm2")


def _result(broken: bool) -> ScenarioResult:
    s1 = good_snapshot(label="S1")
    s2 = good_snapshot(label="S2")
    s2.boot_id = "22222222-2222-3333-4444-555555555555"
    for snapshot in (s1, s2):
        assert snapshot.server is not None
        snapshot.server.environment["HF_TOKEN"] = "<redacted>"
    assert s2.server is not None
    if broken:
        s2.server.argv.remove("--no-async-scheduling")
    result = ScenarioResult(CFX, "qemu:reference", "reference install step")
    result.snapshots = {"S1": s1, "S2": s2}
    result.checks = evaluate_stage(CFX, s1) + evaluate_stage(CFX, s2, previous=s1)
    result.diffs = diff_snapshots(s1, s2, CFX)
    result.steps = {"boot": 8.0, "switch": 5.0, "reboot": 20.0, "checks S2": 0.01}
    result.meter.record("execute", 10.0)
    result.meter.record("reboot", 20.0)
    result.wall_seconds = 40.0
    result.status = RunStatus.FINISHED
    return result


def test_reports_of_a_failed_run(tmp_path: Path) -> None:
    result = _result(broken=True)
    result.error = "WaitTimeout: --api-key sk-secret-1"
    drop_in = Finding(Check.RUNTIME_DROP_IN, Reason.RUNTIME_DROP_IN)
    controls = [ControlOutcome("runtime drop-in", "m", drop_in, True, "caught")]
    paths = write_scenario_report(result, tmp_path, controls=controls)
    data = json.loads(paths["json"].read_text())
    assert data["ok"] is False
    # The profile misses the flag, and the process no longer matches the unit's ExecStart.
    assert [(f["check"], f["reason"], f["subject"]) for f in data["failures"]] == [
        ("profile.args", "arg-missing", "--no-async-scheduling"),
        ("source.not-restarted", "argv-differs", "tenstorrent-serving.service"),
    ]
    assert data["diffs"][0]["field"] == "process.argv"
    assert set(data["snapshots"]) == {"S1", "S2"}
    assert data["timings"]["driver_share"] == 0.75
    assert data["controls"][0]["detected"] is True
    suite = ET.fromstring(paths["junit"].read_text())
    assert suite.get("failures") == "2"
    assert suite.get("errors") == "1"
    failed_case = suite.find("testcase/failure/..")
    assert failed_case is not None
    assert failed_case.get("name") == "--no-async-scheduling"
    markdown = paths["markdown"].read_text()
    assert "| argv has `--no-async-scheduling` | - | pass | FAIL |" in markdown
    assert (
        "| runtime drop-in | yes | source.runtime-drop-in (runtime-drop-in) | caught |" in markdown
    )
    for path in paths.values():
        assert "sk-secret-1" not in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.json", "summary.md"]


def test_reports_of_a_passing_run(tmp_path: Path) -> None:
    result = _result(broken=False)
    data = json.loads(write_scenario_report(result, tmp_path)["json"].read_text())
    assert data["ok"] is True
    assert data["failures"] == []
    assert data["diffs"] == []
    markdown = markdown_summary(result)
    assert "PASSED" in markdown
    assert "| server reports `enable_prefix_caching=True` | - | pass | pass |" in markdown
    assert "## Cache config reported by the running server" in markdown
    assert "| `enable_prefix_caching` | - | True | True |" in markdown
    assert "| `mamba_cache_mode` | - | align | align |" in markdown
    assert timing_breakdown(result)["reboot"] == 20.0


def test_interrupted_run_is_reported_as_such(tmp_path: Path) -> None:
    result = _result(broken=False)
    result.status, result.error = RunStatus.INTERRUPTED, "interrupted (Ctrl-C)"
    data = json.loads(write_scenario_report(result, tmp_path)["json"].read_text())
    assert data["status"] == "interrupted"
    assert data["ok"] is False


def test_evidence_lands_under_its_stage_redacted(tmp_path: Path) -> None:
    result = _result(broken=True)
    result.stopped_at = "S1"
    result.evidence = {
        "S1": {"journal-current-boot": "--api-key sk-secret-2 started\n", "tt-smi": "{}\n"}
    }
    data = json.loads(write_scenario_report(result, tmp_path)["json"].read_text())
    assert data["evidence"] == {
        "S1": ["evidence/S1/journal-current-boot.txt", "evidence/S1/tt-smi.txt"]
    }
    assert data["stopped_at"] == "S1"
    journal = (tmp_path / "evidence/S1/journal-current-boot.txt").read_text()
    assert "started" in journal
    assert "sk-secret-2" not in journal
    markdown = (tmp_path / "summary.md").read_text()
    assert "[tt-smi](evidence/S1/tt-smi.txt)" in markdown
    assert "**Stopped after S1:**" in markdown


def test_controls_report_lists_undetected_controls(tmp_path: Path) -> None:
    masked = Finding(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGE_UNIT_MASKED)
    outcomes = [
        ControlOutcome("a", "m", masked, True, "message a"),
        ControlOutcome("b", "m", masked, False, "NOT DETECTED"),
        ControlOutcome("c", "m", None, True, "no alarm, as required"),
    ]
    paths = write_controls_report(outcomes, [], tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["all_detected"] is False
    assert (data["controls"][0]["check"], data["controls"][0]["reason"]) == (
        "source.hugepages",
        "hugepage-unit-masked",
    )
    markdown = paths["markdown"].read_text()
    assert "| b | **NO** | source.hugepages (hugepage-unit-masked) | NOT DETECTED |" in markdown
    assert "| c | yes | none (false-alarm control) | no alarm, as required |" in markdown


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_atomic(target, "one")
    write_atomic(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_summary_says_which_system_and_accelerator_ran(tmp_path: Path) -> None:
    prebuilt = "/nix/store/aaaa-nixos-system-vm-test-cfx-llm2-26.11.vmtests"
    result = _result(broken=False)
    result.expected_system = prebuilt
    result.snapshots["S1"].generations = {"/run/current-system": prebuilt}

    acceleration = {"requested": "kvm", "used": "kvm", "why": "asked for by $VMTESTS_ACCEL"}
    # What a QEMU machine reports (vmtests.driver.qemu.QemuMachine.acceleration).
    machine = SimpleNamespace(acceleration=acceleration)
    paths = write_scenario_report(result, tmp_path, machine)
    data = json.loads(paths["json"].read_text())
    assert (data["expected_system"], data["switched_system"]) == (prebuilt, prebuilt)
    assert data["accelerator"] == acceleration
    summary = paths["markdown"].read_text()
    assert f"System after the switch: {prebuilt} (the pre-built target)\n" in summary
    assert "Accelerator: kvm (asked for kvm: asked for by $VMTESTS_ACCEL)\n" in summary

    result.snapshots["S1"].generations = {"/run/current-system": "/nix/store/bbbb-other"}
    assert (
        f"System after the switch: /nix/store/bbbb-other, **not** the pre-built target {prebuilt}\n"
    ) in markdown_summary(result)
    del result.snapshots["S1"]  # the switch failed before S1
    assert (
        "System after the switch: unknown (no snapshot after the switch), **not** the pre-built "
        f"target {prebuilt}\n"
    ) in markdown_summary(result)


def test_the_summary_shows_the_restarts_of_each_stage(tmp_path: Path) -> None:
    result = _result(broken=False)
    result.snapshots["S2"].unit.properties["NRestarts"] = "2"
    del result.snapshots["S1"].unit.properties["NRestarts"]
    text = markdown_summary(result)
    assert "## Restarts on their own" in text
    assert "| unit (`NRestarts`) | - | ? | 2 |" in text
    assert "| container | - | - | - |" in text
