"""The CI workflows under .github/workflows: actionlint finds nothing in them, the pre-merge
job runs exactly README's two Quick start commands, and no pull request can start a job on a
self-hosted runner."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
PRE_MERGE = WORKFLOWS / "pre-merge.yml"
QUICK_START_JOB = "quick-start"
# The quick-start job's other shell steps: the dependencies (the commands' own first half) and
# the image cache's keys before and after the run.
SUPPORT_STEPS = ("deps", "cache-key", "built")


def quick_start_commands(readme: str) -> list[str]:
    """The commands of the first ``sh`` block of README's "Quick start" section."""
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no '## Quick start' section"
    block = re.search(r"^```sh\n(.*?)^```", section.group(1), re.MULTILINE | re.DOTALL)
    assert block, "README.md's Quick start has no ```sh block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def job_commands(workflow: dict[str, Any], job: str) -> list[tuple[str | None, str]]:
    """(step id, command) of every shell step of ``job``, in order."""
    steps = workflow["jobs"][job]["steps"]
    return [(step.get("id"), str(step["run"]).strip()) for step in steps if "run" in step]


def quick_start_mismatch(readme: str, workflow: dict[str, Any]) -> list[str]:
    """What keeps the quick-start job from running exactly README's two commands (empty: none)."""
    commands = quick_start_commands(readme)
    problems = []
    if len(commands) != 2:
        problems.append(f"README's Quick start has {len(commands)} commands, not two: {commands}")
    steps = job_commands(workflow, QUICK_START_JOB)
    ran = [command for step_id, command in steps if step_id not in SUPPORT_STEPS]
    if ran != commands:
        problems.append(f"the job runs {ran}, README says {commands}")
    support = {step_id: command for step_id, command in steps if step_id in SUPPORT_STEPS}
    if commands and support.get("deps") != commands[0].split(" && ")[0]:
        problems.append(f"the deps step runs {support.get('deps')!r}, not the commands' first half")
    return problems


def test_the_quick_start_job_runs_exactly_readmes_two_commands() -> None:
    workflow = yaml.safe_load(PRE_MERGE.read_text())
    problems = quick_start_mismatch((ROOT / "README.md").read_text(), workflow)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("where", "old", "new"),
    [
        ("readme", "--profile cfx-llm2", "--profile resident"),
        ("readme", "python3 -m pytest", "python3 -m pytest -x"),
        ("workflow", "--report-dir reports/", "--report-dir out/"),
        ("workflow", "python3 -m pytest", "python3 -m pytest -m 'not vm'"),
    ],
)
def test_the_comparison_catches_a_drift(where: str, old: str, new: str) -> None:
    """Either command drifting on either side is caught."""
    readme = (ROOT / "README.md").read_text()
    workflow_text = PRE_MERGE.read_text()
    if where == "readme":
        assert old in readme
        readme = readme.replace(old, new, 1)
    else:
        assert old in workflow_text
        workflow_text = workflow_text.replace(old, new, 1)
    assert quick_start_mismatch(readme, yaml.safe_load(workflow_text))


def test_actionlint_finds_nothing() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.fail("actionlint is not installed; install the dev extras: pip install -e '.[dev]'")
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (actionlint checks run: steps with it); run "
                    "scripts/install-deps")  # fmt: skip
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert workflows, f"no workflows in {WORKFLOWS}"
    # Files and configuration named: actionlint would otherwise look for a git repository.
    command = [
        actionlint,
        "-no-color",
        "-config-file",
        str(ACTIONLINT_CONFIG),
        *map(str, workflows),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"


# Events that run only what is already on a branch of this repository, or what someone with
# write access started (GitHub's self-hosted runner security guidance: a pull request from a
# fork must never run its code on a persistent self-hosted machine).
TRUSTED_EVENTS = {"push", "merge_group", "workflow_dispatch", "schedule"}


def untrusted_self_hosted_jobs(workflow: dict[str, Any]) -> list[str]:
    """Jobs of ``workflow`` on a self-hosted runner that an untrusted event can start."""
    # YAML 1.1 reads the key `on` as true.
    triggers = next(value for key, value in workflow.items() if str(key) in {"on", "True"})
    events = {triggers} if isinstance(triggers, str) else set(triggers or ())
    untrusted = sorted(events - TRUSTED_EVENTS)
    return [
        f"{name} (runs-on {job['runs-on']}) starts on {untrusted}"
        for name, job in workflow["jobs"].items()
        if "self-hosted" in job.get("runs-on", []) and untrusted
    ]


def test_no_pull_request_starts_a_self_hosted_job() -> None:
    problems = [
        f"{path.name}: {problem}"
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for problem in untrusted_self_hosted_jobs(yaml.safe_load(path.read_text()))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("event", ["pull_request", "pull_request_target", "issue_comment"])
def test_a_self_hosted_job_on_a_pull_request_is_caught(event: str) -> None:
    text = (WORKFLOWS / "flake-check.yml").read_text()
    assert "\non:\n" in text
    workflow = yaml.safe_load(text.replace("\non:\n", f"\non:\n  {event}:\n", 1))
    (problem,) = untrusted_self_hosted_jobs(workflow)
    assert problem.startswith("flake-check (runs-on ['self-hosted', 'nix', 'kvm'])"), problem
