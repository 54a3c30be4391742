"""Judging per condition, the recording, the detectors' counts, the determinism probe and the
restore after an error, against a real local stub server (no VM)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from certify_support import running_stub

from vmtests.certify import determinism, gates, recording, report, run
from vmtests.certify.arms import Configuration, SwitchRecord
from vmtests.certify.context import Context, Options, spec
from vmtests.certify.golden import GoldenRecorder, GoldenStore, server_key
from vmtests.certify.loadgen import LoadGenerator
from vmtests.certify.model import (
    DEGENERATE_DETECTOR,
    ERROR,
    GOLDEN_DETECTOR,
    PASSED,
    PROBE,
    RECORD,
    REPORTED,
    CertificationResult,
    GateResult,
)
from vmtests.certify.prompts import SMOKE
from vmtests.contracts.settings import Settings
from vmtests.driver.errors import DriverError
from vmtests.driver.machine import Machine
from vmtests.guest.local_stub import LocalStubServer
from vmtests.nixcore import CoreOutput
from vmtests.profiles import load_profile
from vmtests.scenario.install.switching import NoSwitch
from vmtests.stub import knobs

ARGS = ["--model", "/models/qwen36", "--served-model-name", "qwen36"]
KEY = server_key("test", "qwen36", "/models/qwen36")
CORE = CoreOutput([], {}, "banner", "sha256:test", None, 60, [], [])
BASE = Configuration(load_profile("cfx-llm2"), CORE)
TIME_SCALE = "0.002"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalStubServer]:
    with running_stub(ARGS, TIME_SCALE) as stub:
        yield stub


def _context(url: str, mode: str, golden: GoldenStore | None = None) -> Context:
    result = CertificationResult("cfx-llm2", "local", None)
    result.options["mode"] = mode
    return Context(
        cast(Machine, None), LoadGenerator(url, model="qwen36", timeout=30), NoSwitch(), BASE,
        result, Options(), golden=golden, settings=Settings(),
        recorder=GoldenRecorder() if mode == RECORD else None,
    )  # fmt: skip


def test_record_then_judge_under_each_condition(server: LocalStubServer, tmp_path: Path) -> None:
    recorder = _context(server.url, RECORD)
    assert gates.correctness(recorder, "smoke", SMOKE).status == PASSED
    assert gates.correctness(recorder, "smoke", SMOKE).status == PASSED  # now warm
    assert recorder.recorder is not None
    assert sorted({at for _, at in recorder.recorder.shas}) == ["b1-cold", "b1-warm"]
    store = GoldenStore("cfx-llm2", KEY, tmp_path)
    written = recording.write_golden(recorder, store)
    assert written.status == PASSED, written.problems
    assert written.numbers["outputs"] == 10
    # The golden comparison is not run in a recording; the detector judged every response.
    assert recorder.result.detectors[DEGENERATE_DETECTOR].judged == 10
    assert recorder.result.detectors[GOLDEN_DETECTOR].judged == 0
    judged = _context(server.url, "certify", store)
    assert gates.correctness(judged, "smoke", SMOKE).status == PASSED
    assert [r.condition for r in judged.result.requests] == ["b1-cold"] * 5
    counts = judged.result.detectors
    assert (counts[GOLDEN_DETECTOR].judged, counts[GOLDEN_DETECTOR].flagged) == (5, 0)
    assert (counts[DEGENERATE_DETECTOR].judged, counts[DEGENERATE_DETECTOR].flagged) == (5, 0)
    text = "\n".join(report.detector_lines(judged.result))
    assert "degenerate-output detector (needs no golden values): judged 5 responses, flagged 0" in (
        text
    )
    assert "golden comparison: judged 5 responses, flagged 0" in text
    # A condition that was never recorded is an error, never a pass.
    batch = judged.batch([spec(p, 48) for p in SMOKE[:2]], concurrency=2, stage="t", label="b2")
    assert all(not r.findings for r in batch.records)
    assert counts[GOLDEN_DETECTOR].not_judged == 2
    assert any("no golden value at condition b2-warm" in p for p in judged.golden_problems)


def test_wrong_and_degenerate_outputs_are_counted_per_detector(tmp_path: Path) -> None:
    with running_stub(ARGS, TIME_SCALE) as plain:
        recorder = _context(plain.url, RECORD)
        gates.correctness(recorder, "smoke", SMOKE)
        store = GoldenStore("cfx-llm2", KEY, tmp_path)
        assert recording.write_golden(recorder, store).status == PASSED
    with running_stub(ARGS, TIME_SCALE, **{knobs.OUTPUT_SALT: "drift"}) as salted:
        judged = _context(salted.url, "certify", store)
        assert gates.correctness(judged, "smoke", SMOKE).status == "failed"
    golden = judged.result.detectors[GOLDEN_DETECTOR]
    assert (golden.judged, golden.flagged, golden.reasons) == (5, 5, {"b1-cold": 5})
    with running_stub(ARGS, TIME_SCALE, **{knobs.DEGENERATE: "1"}) as broken:
        degenerate = _context(broken.url, RECORD)
        gate = gates.correctness(degenerate, "smoke", SMOKE)
        assert gate.status == "failed"
        degenerate.result.gates = [GateResult("preflight", PASSED), gate]
        refused = recording.write_golden(degenerate, GoldenStore("x", KEY, tmp_path))
    assert refused.status == ERROR  # never written from a failed gate
    assert refused.summary == "no output was recorded"  # nor from a degenerate output
    counts = degenerate.result.detectors[DEGENERATE_DETECTOR]
    assert (counts.judged, counts.flagged) == (5, 5)
    assert counts.reasons["char-run"] == 5
    assert not (tmp_path / "x.json").exists()


def test_the_probe_reports_an_identical_stub_and_says_how_texts_part(
    server: LocalStubServer,
) -> None:
    ctx = _context(server.url, PROBE)
    gate = determinism.probe(ctx)
    assert gate.status == REPORTED
    assert gate.numbers["verdicts"] == {"identical across batch sizes, cache state and repeats": 5}
    sizes = sorted({r.condition for r in ctx.result.requests if r.prompt_id == "smoke-1"})
    assert sizes == ["b1-cold", "b1-warm", "b32-warm", "b8-warm"]
    assert len(ctx.result.requests) == 3 * 5 + 2 * 8 + 2 * 32
    part = determinism.divergence("The cache holds blocks.", "The cache keeps blocks.")
    assert part == {
        "common_prefix_chars": 10,
        "first": "The cache holds blocks.",
        "second": "The cache keeps blocks.",
    }
    assert determinism.probe_verdict(["B=8 vs B=1"], []) == (
        "not batch-invariant (differs across batch sizes)"
    )
    assert determinism.probe_verdict(["repeat at B=1"], []).startswith("not deterministic")
    assert determinism.probe_verdict([], ["b1 send 1: degenerate output"]).startswith("wrong: ")


class _Switches:
    """Stands in for ``Context.switch``: records the switches, optionally failing."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def __call__(self, ctx: Context, config: Configuration, reason: str) -> SwitchRecord:
        self.calls.append(reason)
        if self.fail:
            raise DriverError("the machine stopped answering")
        ctx.touched, ctx.current = True, config.name
        return SwitchRecord(config.name, reason)


@pytest.mark.parametrize(
    ("error", "status"), [(DriverError("lost"), "error"), (KeyboardInterrupt(), "interrupted")]
)
def test_every_error_after_a_change_restores_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: BaseException, status: str
) -> None:
    """An error (not only Ctrl-C) in a gate after the run moved the host puts it back."""
    switches = _Switches()

    def gate_that_moves_then_breaks(ctx: Context) -> Any:
        switches(ctx, Configuration(load_profile("resident"), CORE), "A/B block-1-B2")
        raise error

    _patch_run(monkeypatch, switches, gate_that_moves_then_breaks)
    result = run.certify(
        cast(Machine, None), load_profile("cfx-llm2"), target="t", switcher=NoSwitch(),
        report_dir=tmp_path, options=Options(only=("smoke",)),
    )  # fmt: skip
    assert result.status == status
    assert switches.calls == ["A/B block-1-B2", "restore the starting configuration"]
    assert result.left_on == "cfx-llm2"


def test_a_failed_restore_says_where_the_host_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def breaks(ctx: Context) -> Any:
        ctx.touched, ctx.current = True, "unknown (switching to resident)"
        raise DriverError("lost")

    _patch_run(monkeypatch, _Switches(fail=True), breaks)
    result = run.certify(
        cast(Machine, None), load_profile("cfx-llm2"), target="t", switcher=NoSwitch(),
        report_dir=tmp_path, options=Options(only=("smoke",)),
    )  # fmt: skip
    assert "restoring cfx-llm2 failed: DriverError: the machine stopped answering" in result.error
    assert result.left_on == "unknown (switching to resident)"


def test_an_error_before_anything_changed_switches_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    switches = _Switches()

    def breaks(ctx: Context) -> Any:
        raise DriverError("lost")

    _patch_run(monkeypatch, switches, breaks)
    result = run.certify(
        cast(Machine, None), load_profile("cfx-llm2"), target="t", switcher=NoSwitch(),
        report_dir=tmp_path, options=Options(only=("smoke",)),
    )  # fmt: skip
    assert result.status == "error"
    assert switches.calls == []


def _patch_run(monkeypatch: pytest.MonkeyPatch, switches: _Switches, smoke: Any) -> None:
    """``certify`` with a passing preflight, a ``smoke`` gate of the test's choosing, no
    endpoint, no Nix evaluation and ``switches`` in place of real switches."""

    @contextmanager
    def endpoint(machine: Machine, port: int) -> Iterator[str]:
        yield "http://127.0.0.1:9"

    def preflight(ctx: Context) -> Any:
        ctx.current = ctx.base.name
        return GateResult("preflight", PASSED)

    monkeypatch.setattr(run, "serving_endpoint", endpoint)
    monkeypatch.setattr(run, "_server_identity", lambda generator, key_file: (KEY, "qwen36"))
    monkeypatch.setattr(Configuration, "of", classmethod(lambda cls, profile: BASE))
    monkeypatch.setattr(gates, "preflight", preflight)
    monkeypatch.setattr(gates, "correctness", lambda ctx, name, prompts: smoke(ctx))
    # A function, not the instance: only a function becomes a method that receives ``ctx``.
    switch = lambda ctx, config, reason: switches(ctx, config, reason)  # noqa: E731, PLW0108
    monkeypatch.setattr(Context, "switch", switch)
