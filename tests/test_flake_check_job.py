"""The flake-check job (README, Continuous integration): its preflight, run as the workflow runs
it against stand-ins for Nix and /dev/kvm (there is no Nix store here), and a check run that
does not stop at the first failing check."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
JOB = "flake-check"

# Nix 2.18, the oldest nixpkgs accepts (nixpkgs lib/minfeatures.nix), which has no `nix config`:
# every command the preflight does not need fails, as an unknown one would.
FAKE_NIX = """#!/usr/bin/env bash
case "$*" in
  --version) echo "nix (Nix) 2.18.1" ;;
  "build --impure --no-link -L --file scripts/kvm-probe.nix --argstr stamp "*)
    [ -f scripts/kvm-probe.nix ] || exit 98
    printf '%s\\n' "${@: -1}" >> "$FAKE_STAMPS"
    if [ "$FAKE_SANDBOX_OPENS_KVM" != yes ]; then
      echo "error: builder failed with exit code 1" >&2
      exit 1
    fi
    ;;
  *) echo "error: unexpected command: nix $*" >&2; exit 99 ;;
esac
"""
FAKE_STAT = """#!/usr/bin/env bash
[ "$*" = "-c %a /dev/kvm" ] || { echo "unexpected: stat $*" >&2; exit 99; }
if [ -z "$FAKE_KVM_MODE" ]; then
  echo "stat: cannot statx '/dev/kvm': No such file or directory" >&2
  exit 1
fi
echo "$FAKE_KVM_MODE"
"""
FIX_0666 = "make /dev/kvm mode 0666 (README, Continuous integration)"


def flake_check_job() -> dict[str, Any]:
    """The job named flake-check, in whichever workflow holds it."""
    jobs = [
        workflow["jobs"][JOB]
        for workflow in map(yaml.safe_load, map(Path.read_text, sorted(WORKFLOWS.glob("*.yml"))))
        if JOB in workflow.get("jobs", {})
    ]
    assert len(jobs) == 1, f"{len(jobs)} workflows define the job {JOB}"
    job: dict[str, Any] = jobs[0]
    return job


def step_command(step_id: str) -> str:
    (step,) = [step for step in flake_check_job()["steps"] if step.get("id") == step_id]
    return str(step["run"])


def run_preflight(
    tmp_path: Path, *, kvm_mode: str, sandbox_opens_kvm: bool
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The job's preflight step as the runner runs it (bash -eo pipefail, from the checkout)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nix", FAKE_NIX), ("stat", FAKE_STAT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    stamps = tmp_path / "stamps"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_STAMPS": str(stamps),
        "FAKE_KVM_MODE": kvm_mode,
        "FAKE_SANDBOX_OPENS_KVM": "yes" if sandbox_opens_kvm else "no",
    }
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step_command("preflight")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return result, stamps.read_text().split() if stamps.exists() else []


def test_the_preflight_passes_where_a_sandboxed_build_opens_kvm(tmp_path: Path) -> None:
    """Each run builds a new probe (a new stamp), so an earlier success is never reused, and
    nothing newer than Nix 2.18 is needed."""
    first, stamps = run_preflight(tmp_path, kvm_mode="666", sandbox_opens_kvm=True)
    assert first.returncode == 0, first.stdout + first.stderr
    second, stamps = run_preflight(tmp_path, kvm_mode="666", sandbox_opens_kvm=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert len(stamps) == 2, stamps
    assert stamps[0] != stamps[1], stamps


def test_a_kvm_closed_to_the_build_users_stops_the_job_naming_the_fix(tmp_path: Path) -> None:
    """root:kvm 0660, which the daemon's own feature check accepts: the probe fails in the
    sandbox, and the last line names the fix."""
    result, stamps = run_preflight(tmp_path, kvm_mode="660", sandbox_opens_kvm=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(stamps) == 1
    last = result.stdout.splitlines()[-1]
    assert last.startswith("::error::a sandboxed build cannot open /dev/kvm (mode 660"), last
    assert last.endswith(FIX_0666), last


def test_a_probe_failing_on_an_open_kvm_points_at_nix(tmp_path: Path) -> None:
    result, _ = run_preflight(tmp_path, kvm_mode="666", sandbox_opens_kvm=False)
    assert result.returncode == 1
    last = result.stdout.splitlines()[-1]
    assert "system-features in nix.conf" in last, last
    assert FIX_0666 not in last


def test_a_runner_without_kvm_stops_before_building(tmp_path: Path) -> None:
    result, stamps = run_preflight(tmp_path, kvm_mode="", sandbox_opens_kvm=True)
    assert result.returncode == 1
    assert stamps == []
    assert result.stdout.splitlines()[-1].startswith("::error::this runner has no /dev/kvm"), (
        result.stdout
    )


def flake_check_commands(text: str) -> list[list[str]]:
    """Every `nix flake check` command line in ``text``, split into words."""
    return [
        shlex.split(line.strip())
        for line in text.splitlines()
        if line.strip().startswith("nix flake check")
    ]


@pytest.mark.parametrize("where", ["workflow", "README"])
def test_a_failing_check_does_not_stop_the_others(where: str) -> None:
    """Without --keep-going, Nix stops every other goal once a top-level one fails, the other
    profile's VM run among them (Nix src/libstore/build/worker.cc, Worker::removeGoal)."""
    if where == "workflow":
        text = "\n".join(str(step.get("run", "")) for step in flake_check_job()["steps"])
    else:
        text = (ROOT / "README.md").read_text()
    commands = flake_check_commands(text)
    assert commands, f"no `nix flake check` command in the {where}"
    for command in commands:
        assert "--keep-going" in command, f"{where}: {shlex.join(command)}"
