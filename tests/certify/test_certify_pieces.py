"""Pure pieces of the certification run: stop judging, verdicts, report, plan, CLI refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmtests.certify import command, hostops, report
from vmtests.certify.context import Options
from vmtests.certify.gates import bound_numbers, failure_kind
from vmtests.certify.gates_perf import counter_total
from vmtests.certify.loadgen import DEGENERATE, TIMEOUT, RequestRecord
from vmtests.certify.model import (
    ERROR,
    FAILED,
    PASSED,
    CertificationResult,
    GateResult,
)
from vmtests.certify.plan import build_plan, render_plan
from vmtests.cli import main
from vmtests.contracts.settings import Settings
from vmtests.contracts.status import RunStatus
from vmtests.guest import REFERENCE_TARGET
from vmtests.guest.host_settings import ssh_options
from vmtests.guest.targets import TargetError


@pytest.mark.parametrize(
    ("code", "status", "ok", "text"),
    [
        (1, 0, True, "gracefully"),
        (2, 9, False, "KILLED"),
        (1, 137, False, "KILLED"),
        (2, 15, False, "ended by signal 15"),
        (1, 1, False, "exited with status 1"),
    ],
)
def test_stop_exit_judgement(code: int, status: int, ok: bool, text: str) -> None:
    outcome = hostops.judge_exit(code, status, "signal" if code == 2 else "success")
    assert outcome.ok is ok
    assert text in outcome.message


def test_options_never_go_below_the_memory_floor() -> None:
    assert Options(min_mem_gib=1.0).min_mem_gib == 4.0
    assert Options(min_mem_gib=6.0).min_mem_gib == 6.0


def test_bound_numbers_for_the_advisory_cases() -> None:
    numbers = bound_numbers(0, 256)
    assert numbers["clopper_pearson_upper_95"] == pytest.approx(0.011634, abs=1e-6)
    assert numbers["p_detect_1_in_128"] == pytest.approx(0.866, abs=5e-4)
    assert bound_numbers(3, 256)["failure_rate"] == 3 / 256


def test_failure_kinds() -> None:
    """The class comes from the keys the load generator and the judge set, not from the text."""
    assert failure_kind(RequestRecord("s", "l", "p", 0, status=500)) == "http-500"
    timed_out = RequestRecord("s", "l", "p", 0, error="something else", error_kind=TIMEOUT)
    assert failure_kind(timed_out) == "timeout"
    record = RequestRecord("s", "l", "p", 0, status=200, text="x")
    record.add_finding(DEGENERATE, "the text says nothing of its kind")
    assert failure_kind(record) == "degenerate"
    assert record.findings == ["the text says nothing of its kind"]
    assert failure_kind(RequestRecord("s", "l", "p", 0, status=200)) == "empty"


def test_counter_total_sums_label_sets() -> None:
    text = (
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="q"} 128.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="q"} 64.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="q"} 512.0\n'
    )
    assert counter_total(text, "vllm:prefix_cache_hits_total") == 192.0
    assert counter_total(text, "vllm:prefix_cache_queries_total") == 512.0


def _result(*statuses: str, status: str = "finished") -> CertificationResult:
    result = CertificationResult("cfx-llm2", REFERENCE_TARGET, None, status=RunStatus(status))
    result.gates = [GateResult(f"g{i}", s, summary=f"summary {i}") for i, s in enumerate(statuses)]
    return result


def test_verdict_and_exit_status() -> None:
    assert _result(PASSED, PASSED).exit_status == 0
    assert _result(PASSED, PASSED).verdict.startswith("CERTIFIED")
    assert _result(PASSED, FAILED).exit_status == 1
    assert "g1" in _result(PASSED, FAILED).verdict
    assert _result(PASSED, ERROR).exit_status == 3
    assert _result(ERROR, status="refused").exit_status == 3
    assert _result(PASSED, status="interrupted").exit_status == 3
    assert _result().exit_status == 3  # no gate ran: never certified
    partial = _result(PASSED)
    partial.options["partial"] = True
    assert partial.exit_status == 3
    assert "partial" in partial.verdict


def test_report_markdown_verdict_first_and_redacted(tmp_path: Path) -> None:
    """Secrets are redacted, measurements never: a token count is no token."""
    result = _result(PASSED, FAILED)
    result.gates[1].problems.append("request failed with HF_TOKEN=hf_secret123 in its log")
    result.gates[0].numbers.update(prompt_tokens=512, output_tokens=128)
    result.requests.append(
        RequestRecord("smoke", "smoke", "smoke-1", 0, status=200, text="t", prompt_tokens=37)
    )
    paths = report.write_certificate(result, tmp_path)
    text = paths["markdown"].read_text()
    assert text.startswith("# NOT CERTIFIED")
    assert "| g1 | **failed** |" in text
    assert "hf_secret123" not in text
    assert "prompt_tokens=512, output_tokens=128" in text
    data = json.loads(paths["json"].read_text())
    assert data["exit_status"] == 1
    assert data["requests"][0]["prompt_id"] == "smoke-1"
    assert data["requests"][0]["prompt_tokens"] == 37
    assert data["gates"][0]["numbers"]["prompt_tokens"] == 512
    assert "hf_secret123" not in paths["json"].read_text()


def test_plan_lists_every_step_and_the_budget() -> None:
    steps = build_plan(Options(), profile="cfx-llm2", ab_profile="resident", switch="sw")
    text = render_plan(steps)
    assert [s.gate for s in steps][:7] == [
        "preflight", "smoke", "extended", "concurrency", "ab", "decode_b1", "cold_warm",
    ]  # fmt: skip
    assert "8 waves x 32 concurrent = 256 requests" in text
    assert "12 switches" in text
    assert "time budget" in text


def test_cli_plan_changes_nothing_and_ssh_needs_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    # --plan on an unreachable ssh host with opt-in: prints, touches nothing, exits 0.
    switch = "nixos-rebuild switch --flake /etc/nixos#{profile}"
    assert main(["certify", "--profile", "cfx-llm2", "--ab", "resident", "--plan",
                 "--target", "ssh://root@192.0.2.1", "--hw-opt-in",
                 "--switch-command", switch]) == 0  # fmt: skip
    assert "nothing will be changed" in capsys.readouterr().out
    assert main(["certify", "--profile", "cfx-llm2", "--target", "ssh://root@192.0.2.1"]) == 2
    assert "--hw-opt-in" in capsys.readouterr().err
    assert main(["certify", "--profile", "no-such-profile", "--plan"]) == 2
    assert main(["certify", "--profile", "cfx-llm2", "--only", "nope", "--plan"]) == 2
    assert main(["certify", "--profile", "cfx-llm2", "--ab", "resident", "--plan",
                 "--target", "ssh://root@192.0.2.1", "--hw-opt-in"]) == 2  # fmt: skip


def test_the_ssh_key_and_known_hosts_reach_the_ssh_machine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manual certification workflow passes the key and known_hosts from its secrets."""
    seen: list[dict[str, object]] = []

    def machine_from_target(target: str, state_dir: Path, **options: object) -> None:
        seen.append(options)
        raise TargetError("stop here")

    monkeypatch.setattr(command, "machine_from_target", machine_from_target)
    ssh = ["--target", "ssh://root@192.0.2.1", "--hw-opt-in"]
    keys = ["--identity-file", "/run/id", "--known-hosts", "/run/known_hosts"]
    assert main(["certify", "--profile", "cfx-llm2", *ssh, *keys]) == 2
    assert main(["certify", "--profile", "cfx-llm2", *ssh]) == 2
    # Every ssh setting reaches the machine: the flags given, the settings' defaults otherwise.
    given, default = seen
    assert (given["identity_file"], given["known_hosts"]) == (
        Path("/run/id"),
        Path("/run/known_hosts"),
    )
    assert default == ssh_options(Settings())
    assert default["identity_file"] is None
    assert main(["certify", "--profile", "cfx-llm2", "--plan", *keys]) == 2
    assert "apply to ssh:// targets only" in capsys.readouterr().err


def test_html_page_with_plots_when_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = _result(PASSED, PASSED)
    ab = GateResult("ab", PASSED, numbers={"noise_band": 0.005, "ratios": {
        "decode_step": {"ratio": 0.8, "ci_low": 0.78, "ci_high": 0.82}}})  # fmt: skip
    phases = {phase: {"8k": {"makespan": m}} for phase, m in (("cold", 3.0), ("warm", 1.0))}
    result.gates += [ab, GateResult("cold_warm", PASSED, numbers={"phases": phases})]
    result.requests = [
        RequestRecord("ab", f"block-1-{arm}1", "ab-01", i, status=200, text="t", e2e=0.1 * (i + 1))
        for i, arm in enumerate("ABBA")
    ]
    paths = report.write_certificate(result, tmp_path)
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 3
    assert "CERTIFIED" in page


def test_markdown_never_needs_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vmtests.certify.html as html_module  # noqa: PLC0415

    monkeypatch.setattr(html_module, "_pyplot", lambda: None)
    paths = report.write_certificate(_result(PASSED), tmp_path)
    assert set(paths) == {"json", "markdown"}
