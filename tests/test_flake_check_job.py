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
# every command the preflight does not need fails, as an unknown one would. The probe's build
# fails (FAKE_PROBE=fail), as when Nix cannot evaluate or schedule it, or writes the verdict
# that scripts/kvm-probe.nix writes: "open" or "closed", and /dev/kvm's mode in the sandbox.
FAKE_NIX = """#!/usr/bin/env bash
case "$*" in
  --version) echo "nix (Nix) 2.18.1" ;;
  "build --impure -L --out-link "*" --file scripts/kvm-probe.nix --argstr stamp "*)
    [ -f scripts/kvm-probe.nix ] || exit 98
    printf '%s\\n' "${@: -1}" >> "$FAKE_STAMPS"
    if [ "$FAKE_PROBE" = fail ]; then
      echo "error: a 'x86_64-linux' with features {kvm, nixos-test} is required to build" >&2
      exit 1
    fi
    echo "$FAKE_PROBE" > "$5"
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
    tmp_path: Path, *, probe: str, kvm_mode: str = "666"
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The job's preflight step as the runner runs it (bash -eo pipefail, from the checkout).

    ``probe`` is what the probe's build does (see FAKE_NIX), ``kvm_mode`` the mode of /dev/kvm
    as the job sees it ("": not visible). Fails the test if the preflight leaves its temporary
    directory behind.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nix", FAKE_NIX), ("stat", FAKE_STAT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    stamps = tmp_path / "stamps"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "TMPDIR": str(scratch),
        "FAKE_STAMPS": str(stamps),
        "FAKE_KVM_MODE": kvm_mode,
        "FAKE_PROBE": probe,
    }
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step_command("preflight")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert not list(scratch.iterdir()), "the preflight left its temporary directory behind"
    return result, stamps.read_text().split() if stamps.exists() else []


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.splitlines()[-1]


def test_the_preflight_passes_where_a_sandboxed_build_opens_kvm(tmp_path: Path) -> None:
    """Each run builds a new probe (a new stamp), so an earlier verdict is never reused, and
    nothing newer than Nix 2.18 is needed."""
    first, stamps = run_preflight(tmp_path, probe="open 666")
    assert first.returncode == 0, first.stdout + first.stderr
    second, stamps = run_preflight(tmp_path, probe="open 666")
    assert second.returncode == 0, second.stdout + second.stderr
    assert len(stamps) == 2, stamps
    assert stamps[0] != stamps[1], stamps


def test_a_kvm_hidden_from_the_job_is_no_verdict(tmp_path: Path) -> None:
    """nixpkgs' services.github-runners runs the job with PrivateDevices=true: the job sees no
    /dev/kvm, the daemon's builds do, and only the probe decides."""
    result, stamps = run_preflight(tmp_path, probe="open 666", kvm_mode="")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(stamps) == 1
    assert "/dev/kvm as this job sees it: mode not visible to this job" in result.stdout


def test_a_kvm_closed_to_the_build_users_stops_the_job_naming_the_fix(tmp_path: Path) -> None:
    """root:kvm 0660, which the daemon's own feature check accepts: the probe finds it closed
    in the sandbox, and the last line names the fix."""
    result, stamps = run_preflight(tmp_path, probe="closed 660", kvm_mode="")
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(stamps) == 1
    last = last_line(result)
    assert last.startswith("::error::a sandboxed build cannot open /dev/kvm (mode 660"), last
    assert last.endswith(FIX_0666), last


@pytest.mark.parametrize(
    ("probe", "says"),
    [
        ("closed 666", "although it is mode 0666: the Nix daemon or its sandbox"),
        ("closed absent", "a sandboxed build has no /dev/kvm although it was given the kvm"),
    ],
)
def test_a_kvm_closed_for_another_reason_points_at_the_daemon(
    tmp_path: Path, probe: str, says: str
) -> None:
    result, _ = run_preflight(tmp_path, probe=probe)
    assert result.returncode == 1, result.stdout + result.stderr
    last = last_line(result)
    assert last.startswith("::error::"), last
    assert says in last, last
    assert FIX_0666 not in last


def test_a_probe_that_could_not_be_built_is_no_verdict_on_kvm(tmp_path: Path) -> None:
    """A failed build says nothing about /dev/kvm: the line points at Nix's error instead."""
    result, stamps = run_preflight(tmp_path, probe="fail")
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(stamps) == 1
    last = last_line(result)
    assert last.startswith("::error::the /dev/kvm probe (scripts/kvm-probe.nix) could not be"), last
    assert "Nix's error above says why" in last, last
    assert "system-features in nix.conf" in last, last
    assert FIX_0666 not in last
    assert "a sandboxed build cannot" not in last


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
