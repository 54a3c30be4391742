"""``vmtests run --plan``: every step of the persistence run, the switch and rollback commands and
the downtime the serving unit will see, from the host's settings; nothing is changed.

Over ssh the plan also asks the host, read-only, what the preflight would (the versions of its
tools, whether the target evaluates and would restart the serving unit, whether the API wants a
key) and which generation it runs, so that the rollback command it prints is the exact one.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmtests.contracts.serving import MIN_DISK_GIB, MIN_MEM_AVAILABLE_GIB, SERVING_UNIT
from vmtests.contracts.settings import Settings
from vmtests.profiles import Profile
from vmtests.scenario.install.generations import Generation
from vmtests.scenario.runner.preflight import Preflight
from vmtests.scenario.runner.recovery import OnFailure, rollback_command
from vmtests.tt_smi_parse import SNAPSHOT_ON_STDOUT_SINCE_TT_SMI, dotted


@dataclass(frozen=True)
class RunPlan:
    """What the plan knows: the run's parameters and, over ssh, what the host answered."""

    profile: Profile
    target: str
    switch: str
    settings: Settings
    on_failure: OnFailure
    rollback_template: str | None
    deploys_base: bool
    preflight: Preflight | None = None
    generation: Generation | None = None
    generation_note: str = ""


def _rollback_line(plan: RunPlan) -> str:
    if plan.generation is not None:
        command = rollback_command(plan.generation, plan.rollback_template)
        return f"`{command}` (back to {plan.generation.description})"
    if plan.rollback_template:
        return f"`{plan.rollback_template}` ({{generation}}: recorded before the switch)"
    return plan.generation_note or "the generation's command, recorded before the switch"


def render_run_plan(plan: RunPlan) -> str:
    """The plan as numbered lines, then the downtime and the preflight's answers."""
    settings = plan.settings
    hugepages = plan.profile.hugepages
    pages = f" and {hugepages.count} x {hugepages.size} hugepages to reserve" if hugepages else ""
    recovery = (
        f"roll back with {_rollback_line(plan)}"
        if plan.on_failure == OnFailure.ROLLBACK
        else f"leave the host as it is; the command that goes back: {_rollback_line(plan)}"
    )
    tt_smi = dotted(SNAPSHOT_ON_STDOUT_SINCE_TT_SMI)
    steps = [
        "boot a fresh reference guest and deploy the base configuration (baseline)"
        if plan.deploys_base
        else f"connect to {plan.target} (read-only until the switch)",
        "preflight, read only: the tools (systemctl, journalctl, curl, tt-smi, docker, the "
        f"switch's program) and their versions, tt-smi >= {tt_smi}; MemAvailable >= "
        f"{MIN_MEM_AVAILABLE_GIB:.0f} GiB{pages}; >= {MIN_DISK_GIB:.0f} GiB free on /; "
        f"{SERVING_UNIT} runs; the target "
        f"evaluates and its switch restarts it; GET /v1/models (401 without the key refuses). "
        "Any refusal stops here with exit status 2, nothing changed",
        "record the generation the host runs (what a rollback goes back to)",
        "snapshot S0 (read only)",
        f"switch: {plan.switch} (at most {settings.switch_timeout:g} s), then wait until "
        f"{SERVING_UNIT} is active and /health answers (at most {settings.ready_timeout:g} s)",
        "snapshot S1 and its checks; if any fails: collect the evidence and stop (no reboot)",
        f"reboot (at most {settings.reboot_timeout:g} s until the host answers), then wait for "
        f"the server (at most {settings.ready_timeout:g} s)",
        "snapshot S2, its checks, S1/S2 compared on every durable field",
        f"on a failure, an error or Ctrl-C: collect the evidence, then {recovery}",
    ]
    lines = [f"{number}. {step}" for number, step in enumerate(steps, 1)]
    switch_down = settings.stop_timeout + settings.ready_timeout
    reboot_down = settings.reboot_timeout + settings.ready_timeout
    lines += [
        "",
        f"downtime of {SERVING_UNIT}: from the switch until S1 answers, at most "
        f"{switch_down:g} s (stop_timeout + ready_timeout); from the reboot until S2 answers, at "
        f"most {reboot_down:g} s (reboot_timeout + ready_timeout); at most "
        f"{switch_down + reboot_down:g} s in all, plus the rollback's if it fails",
        "settings: "
        + ", ".join(f"{name}={value} ({source})" for name, value, source in settings.describe()),
    ]
    if plan.preflight is not None:
        lines += ["", "preflight now (read only):"]
        lines += [
            f"  {'ok  ' if item.ok else 'STOP'} {item.subject}: {item.message}"
            for item in plan.preflight.items
        ]
    return "\n".join(lines)
