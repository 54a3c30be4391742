"""``vmtests certify`` end to end against reference guests with the stub (CI): every gate, the
A/B included.

Each test gets its own guest with the production profile deployed as the module renders it (the
stub in a container), serving with the stub's knobs it asks for, restored from the snapshot
cache: the knobs are set in the stub device layer's knobs file (``/etc``, read by the container
as ``--env-file``, a durable place, so the preflight's persistence checks stay clean) and the
unit restarted through systemd once, when that state is saved. CI time is kept small by the
stub's time scale, never by lowering the gates' request counts.

Each gate is shown passing (the correct configuration certifies) and failing (fault knobs, a
memory hog, a SIGKILL on stop). The A/B runs 2 ABBA blocks here instead of the default 3 (the
per-run request count is unchanged), at a larger time scale than the other gates: a configured
step factor leaves the noise band in the right direction, no factor stays inside, and an
interrupt in the middle of an arm leaves the host on the configuration it started from. A
restore costs seconds where a boot and a deployment cost minutes, so the tests share no guest
and run on whichever worker is free (``docs/ci-time.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from certify_vm_support import (
    AB_TIME_SCALE,
    CI_TIME_SCALE,
    KILL_DROP_IN,
    NO_EFFECT,
    ServingGuest,
    run,
)

from vmtests.certify import gates_perf, stats
from vmtests.certify.context import Options
from vmtests.certify.hostops import mem_available_kib
from vmtests.certify.loadgen import BatchResult
from vmtests.certify.run import certify
from vmtests.contracts.serving import SERVING_CONTAINER
from vmtests.guest.access import ssh_to_guest
from vmtests.profiles import load_profile
from vmtests.scenario.install.switching import NoSwitch
from vmtests.stub import knobs

pytestmark = [pytest.mark.vm]


def test_correct_configuration_certifies(serving_guest: ServingGuest, tmp_path: Path) -> None:
    guest = serving_guest(**{knobs.TIME_SCALE: CI_TIME_SCALE})
    result = run(guest, tmp_path)
    statuses = {gate.name: gate.status for gate in result.gates}
    assert result.exit_status == 0, (result.verdict, [g.problems[:3] for g in result.gates])
    assert statuses == dict.fromkeys(
        ["preflight", "smoke", "extended", "concurrency", "decode_b1", "cold_warm"], "passed"
    )
    conc = result.gate("concurrency")
    assert conc is not None
    assert conc.numbers["n"] == 256
    assert conc.numbers["failures"] == 0
    assert conc.numbers["clopper_pearson_upper_95"] == pytest.approx(0.011634, abs=1e-6)
    cold_warm = result.gate("cold_warm")
    assert cold_warm is not None
    phases = cold_warm.numbers["phases"]
    for size in ("8k", "16k", "32k"):
        assert (
            phases["warm"][size]["prefix_cache_hit_ratio"]
            > phases["cold"][size]["prefix_cache_hit_ratio"]
        )
    # The cached prefix shortens the modelled prefill; only at 32k does that reliably outweigh
    # what the emulated guest itself spends on a prompt on a loaded host (docs/ci-time.md).
    assert phases["warm"]["32k"]["ttft_p95"] < phases["cold"]["32k"]["ttft_p95"]
    assert result.left_on == "cfx-llm2"
    data = json.loads((tmp_path / "certificate.json").read_text())
    assert len(data["requests"]) == len(result.requests) > 256
    assert (tmp_path / "certificate.md").read_text().startswith("# CERTIFIED")


def test_the_same_certification_runs_over_ssh(serving_guest: ServingGuest, tmp_path: Path) -> None:
    """The hardware tier's path on the same guest: an ``SshMachine`` runs every host step and
    the requests go through its ssh tunnel (the serving port is not reachable directly)."""
    guest = serving_guest(**{knobs.TIME_SCALE: CI_TIME_SCALE})
    ssh = ssh_to_guest(guest, tmp_path / "ssh")
    ssh.start()
    try:
        result = certify(
            ssh,
            load_profile("cfx-llm2"),
            target=f"ssh://root@127.0.0.1:{guest.ssh_port}",
            switcher=NoSwitch(),
            report_dir=tmp_path / "report",
            options=Options(only=("smoke", "extended")),
        )
    finally:
        ssh.close()
    statuses = {gate.name: gate.status for gate in result.gates}
    assert statuses == dict.fromkeys(["preflight", "smoke", "extended"], "passed"), [
        g.problems[:3] for g in result.gates
    ]
    # Every gate it ran passed, and still: a partial run never certifies (exit 3).
    assert result.exit_status == 3
    assert "a partial run never certifies" in result.verdict
    assert result.identity["hostname"] == guest.succeed("cat /proc/sys/kernel/hostname").strip()
    assert len(result.requests) == 5 + 11


@pytest.mark.nightly
def test_fail_rate_fails_the_bound_with_its_numbers(
    serving_guest: ServingGuest, tmp_path: Path
) -> None:
    guest = serving_guest(
        **{knobs.TIME_SCALE: CI_TIME_SCALE, knobs.FAIL_RATE: "0.02", knobs.FAULT_SEED: "7"},
    )
    result = run(guest, tmp_path, only=("concurrency",))
    gate = result.gate("concurrency")
    assert gate is not None
    assert gate.status == "failed"
    assert result.exit_status == 1
    failed = [r for r in result.requests if r.status == 500]
    assert failed, "a 2 % fail rate over 256 requests produced no HTTP 500"
    assert gate.numbers["failures"] == len(failed)
    assert gate.numbers["failure_kinds"] == {"http-500": len(failed)}
    expected = stats.clopper_pearson_upper(len(failed), 256)
    assert gate.numbers["clopper_pearson_upper_95"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("knob", "value", "finding"),
    [(knobs.DEGENERATE, "1", "degenerate output"), (knobs.OUTPUT_SALT, "drift", "wrong output")],
)
def test_bad_outputs_fail_correctness(
    serving_guest: ServingGuest, tmp_path: Path, knob: str, value: str, finding: str
) -> None:
    guest = serving_guest(**{knobs.TIME_SCALE: CI_TIME_SCALE, knob: value})
    result = run(guest, tmp_path, only=("smoke", "extended"))
    for name, count in (("smoke", 5), ("extended", 11)):
        gate = result.gate(name)
        assert gate is not None
        assert gate.status == "failed"
        assert gate.numbers["failed"] == count
        assert all(finding in problem for problem in gate.problems), gate.problems
    assert result.exit_status == 1


def test_memory_hog_makes_preflight_refuse(serving_guest: ServingGuest, tmp_path: Path) -> None:
    guest = serving_guest(**{knobs.TIME_SCALE: CI_TIME_SCALE})
    available = mem_available_kib(guest)
    hog_kib = available - 3 * 1024 * 1024  # leave 3 GiB: below the 4 GiB floor
    guest.succeed(
        f"mkdir -p /mnt/hog && mount -t tmpfs -o size={hog_kib + 65536}k hog /mnt/hog "
        f"&& fallocate -l {hog_kib}k /mnt/hog/fill",
        timeout=300,
    )
    try:
        result = run(guest, tmp_path)
    finally:
        guest.succeed("umount /mnt/hog")
    assert result.status == "refused"
    assert result.exit_status == 3
    assert [gate.name for gate in result.gates] == ["preflight"]
    assert "below the 4.0 GiB floor" in result.error
    assert result.left_on == "cfx-llm2"


def test_sigkill_on_stop_fails_the_stop_check(serving_guest: ServingGuest, tmp_path: Path) -> None:
    guest = serving_guest(**{knobs.TIME_SCALE: CI_TIME_SCALE})
    # The stop kills the container (what `docker stop -t 60` does when the grace time runs out).
    guest.write_file(
        KILL_DROP_IN, f"[Service]\nExecStop=\nExecStop=/usr/bin/docker kill {SERVING_CONTAINER}\n"
    )
    guest.succeed("systemctl daemon-reload")
    try:
        result = run(guest, tmp_path, only=("cold_warm",))
    finally:
        guest.succeed(f"rm -f {KILL_DROP_IN} && systemctl daemon-reload")
    gate = result.gate("cold_warm")
    assert gate is not None
    assert gate.status == "failed"
    assert gate.numbers["restart_stop"]["exec_main_status"] == 137  # docker run: 128 + SIGKILL
    assert "KILLED" in gate.problems[0]
    assert result.exit_status == 1


@pytest.mark.nightly
def test_ab_without_a_factor_stays_inside_the_noise_band(
    serving_guest: ServingGuest, tmp_path: Path
) -> None:
    guest = serving_guest(**{knobs.TIME_SCALE: AB_TIME_SCALE, knobs.STEP_FACTORS: NO_EFFECT})
    result = run(guest, tmp_path, ab="resident", only=("ab",), ab_blocks=2)
    gate = result.gate("ab")
    assert gate is not None
    assert gate.status == "passed", gate.problems
    assert gate.numbers["decision"] == "inside-noise-band", gate.numbers["decision_text"]
    assert len(result.switches) == 8  # 2 ABBA blocks, each arm a real switch
    assert all(switch.ok for switch in result.switches)
    assert [s.configuration for s in result.switches[:4]] == [
        "cfx-llm2", "resident", "resident", "cfx-llm2",
    ]  # fmt: skip
    assert result.left_on == "cfx-llm2"


@pytest.mark.nightly
def test_ab_step_factor_leaves_the_noise_band(serving_guest: ServingGuest, tmp_path: Path) -> None:
    factors = json.dumps({"deviceResident": 0.8, "deviceArgmax": 1.0})
    guest = serving_guest(**{knobs.TIME_SCALE: AB_TIME_SCALE, knobs.STEP_FACTORS: factors})
    result = run(guest, tmp_path, ab="resident", only=("ab",), ab_blocks=2)
    gate = result.gate("ab")
    assert gate is not None
    assert gate.numbers["decision"] == "faster", gate.numbers.get("decision_text")
    ratio = gate.numbers["ratios"]["decode_step"]
    assert ratio["ci_high"] < 1 - stats.NOISE_BAND
    assert result.left_on == "cfx-llm2"


@pytest.mark.nightly
def test_interrupt_restores_the_starting_configuration(
    serving_guest: ServingGuest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guest = serving_guest(**{knobs.TIME_SCALE: CI_TIME_SCALE, knobs.STEP_FACTORS: NO_EFFECT})
    measured: list[BatchResult] = []
    original = gates_perf.run_figures

    def interrupt_in_arm_b(batch: BatchResult) -> dict[str, float]:
        measured.append(batch)
        if len(measured) == 2:  # the first B run of the first ABBA block: the host is on B
            raise KeyboardInterrupt
        return original(batch)

    monkeypatch.setattr(gates_perf, "run_figures", interrupt_in_arm_b)
    result = run(guest, tmp_path, ab="resident", only=("ab",), ab_blocks=2)
    assert result.status == "interrupted"
    assert result.exit_status == 3
    assert [s.configuration for s in result.switches] == ["cfx-llm2", "resident", "cfx-llm2"]
    assert result.switches[-1].reason == "restore the starting configuration"
    assert result.switches[-1].ok
    assert result.left_on == "cfx-llm2"
    data = json.loads((tmp_path / "certificate.json").read_text())
    assert data["status"] == "interrupted"
    assert data["left_on"] == "cfx-llm2"
