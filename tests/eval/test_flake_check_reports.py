"""scripts/flake-check-reports: the persistence reports of ``nix flake check``, passed or failed,
copied out of the store for CI, and the failed ones forgotten so that the next check runs them.

Its shell runs against a stand-in ``nix`` (no store here); the Nix expression it applies to the
flake's checks is evaluated with the real nix-instantiate."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from vmtests.nixrun import evaluate_json

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "flake-check-reports"

FAKE_NIX = """#!/usr/bin/env bash
case "$*" in
  "eval --impure --raw --expr builtins.currentSystem") printf x86_64-linux ;;
  "eval --raw .#checks.x86_64-linux --apply "*) printf '%s' "$FAKE_REPORTS" ;;
  "store delete "*) shift 2; printf '%s\\n' "$@" >> "$FAKE_DELETED" ;;
  *) echo "unexpected: nix $*" >&2; exit 99 ;;
esac
"""


def report(store: Path, name: str, failed: str | None = None) -> Path:
    """A report as the flake leaves it in the store; ``failed`` is the exit status."""
    path = store / f"hash-vmtests-persistence-report-{name}"
    path.mkdir(parents=True)
    (path / "summary.md").write_text(f"# {name}\n")
    if failed is not None:
        (path / "nix-support").mkdir()
        (path / "nix-support" / "failed").write_text(failed)
    return path


def test_reports_are_copied_passed_or_failed_and_failed_ones_forgotten(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nix").write_text(FAKE_NIX)
    (bin_dir / "nix").chmod(0o755)
    store = tmp_path / "store"
    passed, failed = report(store, "cfx-llm2"), report(store, "resident", failed="1")
    lines = [
        f"persistence-cfx-llm2 {passed}",
        f"persistence-resident {failed}",
        f"persistence-other {store / 'never-built'}",
    ]
    deleted = tmp_path / "deleted"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_REPORTS": "\n".join(lines),
        "FAKE_DELETED": str(deleted),
    }
    dest = tmp_path / "reports"
    result = subprocess.run(
        [str(SCRIPT), "--forget-failed", str(dest)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (dest / "persistence-cfx-llm2" / "summary.md").read_text() == "# cfx-llm2\n"
    assert (dest / "persistence-resident" / "nix-support" / "failed").read_text() == "1"
    assert not (dest / "persistence-other").exists()
    assert "persistence-cfx-llm2: passed" in result.stdout
    assert "persistence-resident: FAILED (exit status 1)" in result.stdout
    assert (
        "persistence-other: no report in the store "
        f"({store / 'never-built'}): its run did not finish (stopped after another check failed, "
        "killed, or a dependency failed; see the nix flake check log)"
    ) in result.stdout
    assert deleted.read_text().split() == [str(failed)]  # only the failed one is forgotten


@pytest.mark.nix
def test_the_expression_lists_the_persistence_reports_and_touches_no_other_check(
    nix: str,
) -> None:
    """The persistence checks are picked by name before any value is forced: another check
    that throws (core-profiles, on a failing profile) or breaks the run must not cost the
    reports of the runs that did finish."""
    apply = re.search(r"--apply '(.*?)'\)", SCRIPT.read_text(), re.DOTALL)
    assert apply, "no --apply expression in scripts/flake-check-reports"
    checks = """{
      persistence-cfx-llm2 = { report = { outPath = "/nix/store/a-report"; }; };
      core-profiles = throw "serving profiles fail their assertions";
      other = { report = throw "a check that is not a persistence check"; };
      persistence-resident = { report = { outPath = "/nix/store/c-report"; }; };
    }"""
    listed = evaluate_json(f"({apply.group(1)}) {checks}")
    assert sorted(listed.splitlines()) == [
        "persistence-cfx-llm2 /nix/store/a-report",
        "persistence-resident /nix/store/c-report",
    ]
