"""Negative controls: real ways a configuration fails to persist, each of which must be caught.

Every control starts from the correct target configuration (installed by the reference switch),
applies one real mechanism on the reference guest (a ``/run`` drop-in, ``systemctl
set-environment``, a hand-started server, ...), snapshots the machine (after a reboot when the
failure only shows then) and runs the ordinary checks. Each control declares the finding it
must produce (a ``Check`` and a ``Reason``, ``vmtests.contracts.findings``): it is *detected*
when a failing result carries exactly that finding, whatever the message says. A false-alarm
control declares none and is detected when nothing fails; so is the correct configuration
itself (no false alarms).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vmtests.contracts.features import ENV_FEATURES, banner_text, env_name
from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.contracts.serving import HUGEPAGES_UNIT, SERVING_CONTAINER, SERVING_UNIT, Hugepages
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest.stub_layer import GUEST_PYTHONPATH, set_stub_knobs
from vmtests.scenario.checks import evaluate_stage
from vmtests.scenario.collect import take_snapshot
from vmtests.scenario.reference_switch import (
    UNIT_DIR,
    UNIT_RESTART_TIMEOUT,
    ReferenceSwitch,
    ServingConfig,
    container_of,
    install_units,
    render_units,
    restart_serving,
    stage_units,
    systemd_quote,
    write_rendered,
)
from vmtests.scenario.results import CheckResult, failures, findings
from vmtests.scenario.serving_unit import (
    BACKEND,
    RenderedUnits,
    hugepages_path,
    run_script_text,
)
from vmtests.scenario.snapshot import Snapshot
from vmtests.scenario.switching import wait_healthy, wait_ready
from vmtests.stub import knobs, release

RUNTIME_DROP_IN_DIR = f"/run/systemd/system/{SERVING_UNIT}.d"
DURABLE_DROP_IN_DIR = f"{UNIT_DIR}/{SERVING_UNIT}.d"
HAND_PID_FILE = "/run/vmtests-hand-serving.pid"
RUNTIME_CONFIG_DIR = "/run/tenstorrent-serving"
RUN_ENV_FILE = f"{RUNTIME_CONFIG_DIR}/features.env"
RUN_FLAGS_FILE = f"{RUNTIME_CONFIG_DIR}/flags.sh"
WRAPPER = "/usr/local/bin/tenstorrent-serving-wrapper"
UNRELATED_VARIABLE = "EDITOR"
VENDOR_UNIT_DIR = "/usr/lib/systemd/system"
SETTLE_TIMEOUT = 120.0

Apply = Callable[[Machine, ReferenceSwitch], None]


@dataclass(frozen=True)
class Control:
    """One negative control: the mechanism, and the finding that must catch it.

    ``finds`` is None for a false-alarm control: unrelated state that must raise no failure
    at all ("detected" then means "no alarm", as required).
    """

    name: str
    mechanism: str
    finds: Finding | None
    apply: Apply
    reboot: bool = False
    settle: bool = True  # wait for the unit and /health after applying (False: unit stopped)
    # What the mechanism starts from: "running" (it changes a running target: masks,
    # disables), "installed" (the target's units, stopped) or "clean" (it installs and starts
    # what it needs itself, and its first step reloads systemd: the reset does not). Each
    # restart or daemon-reload the reset saves costs seconds to most of a minute under TCG.
    starts_from: Literal["clean", "installed", "running"] = "clean"

    @property
    def false_alarm(self) -> bool:
        """True for a control that must raise no failure at all."""
        return self.finds is None


@dataclass
class ControlOutcome:
    """What happened when a control was applied: detected or not, the failures it raised (the
    message of the one that caught it first) and the snapshot they come from."""

    name: str
    mechanism: str
    finds: Finding | None
    detected: bool
    message: str
    failures: list[CheckResult] = field(default_factory=list)
    snapshot: Snapshot | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "name": self.name,
            "mechanism": self.mechanism,
            "finds": None if self.finds is None else str(self.finds),
            "check": None if self.finds is None else self.finds.check,
            "reason": None if self.finds is None else self.finds.reason,
            "detected": self.detected,
            "message": self.message,
            "failures": [failure.to_dict() for failure in self.failures],
            "snapshot": None if self.snapshot is None else self.snapshot.to_dict(),
            "seconds": round(self.seconds, 2),
        }


def judge(
    name: str,
    mechanism: str,
    finds: Finding | None,
    results: list[CheckResult],
    snapshot: Snapshot | None = None,
) -> ControlOutcome:
    """The outcome of a control that declared ``finds`` and raised ``results``: detected when
    a failure carries that finding; with ``finds`` None, when nothing fails."""
    failed = failures(results)
    if finds is None:
        detected = not failed
        message = "no alarm, as required" if detected else f"FALSE ALARM: {failed[0]}"
    else:
        caught = [result for result in failed if result.finding == finds]
        detected = bool(caught)
        seen = ", ".join(map(str, sorted(findings(results)))) or "no failure"
        message = caught[0].message if caught else f"NOT DETECTED: no {finds}; seen: {seen}"
    return ControlOutcome(name, mechanism, finds, detected, message, failed, snapshot)


# ---- mechanisms ------------------------------------------------------------------------------


def _feature_free(switch: ReferenceSwitch) -> ServingConfig:
    """The target's units with the base's argv, environment and banner (hugepages kept)."""
    base = switch.base
    return replace(switch.target, args=base.args, environment=base.environment, banner=base.banner)


def _restart(machine: Machine, config: ServingConfig) -> None:
    """Reload once (the units staged, the control's own files written) and restart."""
    machine.succeed("systemctl daemon-reload", timeout=UNIT_RESTART_TIMEOUT)
    restart_serving(machine, config)


def _durable_drop_in(machine: Machine, name: str, settings: list[str]) -> None:
    """Write a ``[Service]`` drop-in of the serving unit under /etc (durable)."""
    machine.write_file(f"{DURABLE_DROP_IN_DIR}/{name}", "\n".join(["[Service]", *settings, ""]))


def _exec_lines(machine: Machine, config: ServingConfig) -> list[str]:
    """The ExecStart/ExecStartPre/Environment lines of ``config``'s serving unit.

    Its scripts are written to the store directory (not its unit files), so that a drop-in
    can point at them, as a hand-made drop-in would point at store paths on NixOS.
    """
    rendered = render_units(config)
    write_rendered(machine, RenderedUnits(scripts=rendered.scripts))
    keep = ("ExecStart=", "ExecStartPre=", "Environment=")
    return [line for line in rendered.units[SERVING_UNIT].splitlines() if line.startswith(keep)]


def runtime_drop_in(machine: Machine, switch: ReferenceSwitch) -> None:
    """The durable unit lacks the features; a drop-in under /run adds them (lost at reboot)."""
    config = _feature_free(switch)
    stage_units(machine, config)
    exec_lines = _exec_lines(machine, switch.target)
    lines = ["[Service]", "ExecStartPre=", "ExecStart=", *exec_lines, ""]
    machine.write_file(f"{RUNTIME_DROP_IN_DIR}/50-validated.conf", "\n".join(lines))
    _restart(machine, config)


def manager_environment(machine: Machine, switch: ReferenceSwitch) -> None:
    """The unit lacks the feature variables; ``systemctl set-environment`` supplies them."""
    names = [env_name(feature) for feature in ENV_FEATURES]
    config = switch.target.without_env(*names)
    stage_units(machine, config)
    assignments = [f"{k}={v}" for k, v in switch.target.environment.items() if k in names]
    machine.succeed("systemctl set-environment %s", assignments)
    _restart(machine, config)


def not_restarted(machine: Machine, switch: ReferenceSwitch) -> None:
    """The unit file is switched and reloaded, but the running service is not restarted."""
    install_units(machine, _feature_free(switch))
    install_units(machine, switch.target, restart=False)


def not_reloaded(machine: Machine, switch: ReferenceSwitch) -> None:
    """The unit file is switched on disk, without daemon-reload and without a restart."""
    install_units(machine, _feature_free(switch))
    install_units(machine, switch.target, reload=False)


def lying_banner(machine: Machine, switch: ReferenceSwitch) -> None:
    """A durable drop-in prints the SDPA streaming banner; the environment lacks the switch."""
    config = switch.target.without_env(env_name("sdpaStreaming"))
    stage_units(machine, config)
    echo = f"ExecStartPre=/bin/echo {systemd_quote(banner_text('sdpaStreaming'))}"
    _durable_drop_in(machine, "50-banner.conf", [echo])
    _restart(machine, config)


def engine_without_prefix_caching(machine: Machine, switch: ReferenceSwitch) -> None:
    """argv and banners claim prefix caching; the engine runs without it.

    The unit keeps ``--enable-prefix-caching`` and the module banner; the container runs a
    model build that does not declare ``supports_prefix_caching`` (a stub knob: the TT
    plugin's ``check_and_update_config`` then switches prefix caching off,
    vllm_tt_plugin/platform.py), and a durable drop-in echoes the prefix-caching banners the
    profile looks for. Only the server's own cache config (``vllm:cache_config_info``, the
    engine config line) tells the truth.
    """
    config = switch.target
    stage_units(machine, config)
    set_stub_knobs(machine, **{knobs.MODEL_CAPABILITIES: '{"supports_prefix_caching":false}'})
    banners = [
        release.prefix_caching_line(True),
        banner_text("prefixCaching", mode="align"),
    ]
    lines = [f"ExecStartPre=/bin/echo {systemd_quote(text)}" for text in banners]
    _durable_drop_in(machine, "50-model-build.conf", lines)
    _restart(machine, config)


def env_file_under_run(machine: Machine, switch: ReferenceSwitch) -> None:
    """The feature variables reach the container only from a ``--env-file`` under /run.

    As oci-containers renders ``environmentFiles = [ "/run/..." ]``
    (nixpkgs ``nixos/modules/virtualisation/oci-containers.nix``): the unit and the module
    are durable, the file they point at is not.
    """
    names = [env_name(feature) for feature in ENV_FEATURES]
    values = [f"{k}={v}" for k, v in switch.target.environment.items() if k in names]
    machine.write_file(RUN_ENV_FILE, "\n".join([*values, ""]))
    config = replace(switch.target.without_env(*names), environment_files=(RUN_ENV_FILE,))
    install_units(machine, config, wait=False)


def wrapper_sources_run(machine: Machine, switch: ReferenceSwitch) -> None:
    """A durable ExecStart wrapper runs the container with flags sourced from a file under /run.

    The wrapper is the unit's own ``docker run`` without the serving arguments, which it takes
    from ``RUN_FLAGS_FILE`` (``set -- <flags>``) when it starts.
    """
    target = switch.target
    config = target
    stage_units(machine, config)
    docker_run = run_script_text(replace(container_of(target), cmd=()))
    script = "\n".join(["#!/bin/sh", f". {RUN_FLAGS_FILE}", f'{docker_run} \\\n  "$@"', ""])
    machine.write_file(RUN_FLAGS_FILE, f"set -- {shlex.join(target.args)}\n")
    machine.write_file(WRAPPER, script)
    machine.succeed("chmod 755 %s", WRAPPER)
    _durable_drop_in(machine, "50-wrapper.conf", ["ExecStart=", f"ExecStart={WRAPPER}"])
    _restart(machine, config)


def unrelated_manager_variable(machine: Machine, switch: ReferenceSwitch) -> None:
    """The correct configuration plus ``systemctl set-environment EDITOR=vi`` (unrelated)."""
    config = switch.target
    stage_units(machine, config)
    machine.succeed(f"systemctl set-environment {UNRELATED_VARIABLE}=vi")
    _restart(machine, config)


def unrelated_runtime_drop_in(machine: Machine, switch: ReferenceSwitch) -> None:
    """The correct configuration plus a /run drop-in that only sets CPUWeight= (unrelated)."""
    config = switch.target
    stage_units(machine, config)
    machine.write_file(f"{RUNTIME_DROP_IN_DIR}/50-weight.conf", "[Service]\nCPUWeight=50\n")
    _restart(machine, config)


def runtime_hugepages(machine: Machine, switch: ReferenceSwitch) -> None:
    """No boot-time hugepage unit; the pages are written to sysfs at runtime."""
    install_units(machine, replace(switch.target, hugepages=None))
    hugepages = switch.target.hugepages or Hugepages(2, "1G")
    machine.succeed(f"echo {hugepages.count} > {hugepages_path(hugepages.size_kib)}")


def masked_hugepage_unit(machine: Machine, switch: ReferenceSwitch) -> None:
    """The boot-time hugepage unit, installed as a package would, is masked in /etc.

    ``systemctl mask`` refuses a unit whose file is in /etc itself, so the unit first moves to
    the vendor directory (where distribution packages install it); pages stay reserved now.
    """
    del switch
    machine.succeed(
        f"mv {UNIT_DIR}/{HUGEPAGES_UNIT} {VENDOR_UNIT_DIR}/ && systemctl daemon-reload && "
        f"systemctl mask {HUGEPAGES_UNIT} 2>&1"
    )


def not_enabled(machine: Machine, switch: ReferenceSwitch) -> None:
    """The serving unit runs now but is disabled: nothing starts it at the next boot."""
    del switch
    machine.succeed(f"systemctl disable {SERVING_UNIT} 2>&1")


def hand_started(machine: Machine, switch: ReferenceSwitch) -> None:
    """The unit is stopped and the validated server is started by hand, outside systemd."""
    target = switch.target
    machine.succeed(f"systemctl stop {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)
    environment = {"PYTHONPATH": GUEST_PYTHONPATH, **target.environment}
    machine.succeed(
        "env %s setsid nohup python3 -m vmtests.stub.server %s "
        "> /var/log/vmtests-hand-serving.log 2>&1 < /dev/null & echo $! > %s",
        [f"{k}={v}" for k, v in environment.items()],
        target.args,
        HAND_PID_FILE,
    )
    wait_healthy(machine, target.port, timeout=120)


def transient_unit(machine: Machine, switch: ReferenceSwitch) -> None:
    """No durable unit: the server runs as a transient ``systemd-run`` unit under /run."""
    target = switch.target
    machine.succeed(
        f"systemctl disable --now {SERVING_UNIT} 2>&1; rm -f {UNIT_DIR}/{SERVING_UNIT}; "
        "systemctl daemon-reload",
        timeout=UNIT_RESTART_TIMEOUT,
    )
    environment = {"PYTHONPATH": GUEST_PYTHONPATH, **target.environment}
    machine.succeed(
        "systemd-run --unit %s %s /usr/bin/python3 -m vmtests.stub.server %s",
        SERVING_UNIT,
        [word for k, v in environment.items() for word in ("-E", f"{k}={v}")],
        target.args,
    )


CONTROLS: tuple[Control, ...] = (
    Control(
        "runtime drop-in",
        f"validated flags and env only in {RUNTIME_DROP_IN_DIR}/50-validated.conf",
        Finding(Check.RUNTIME_DROP_IN, Reason.RUNTIME_DROP_IN),
        runtime_drop_in,
    ),
    Control(
        "stale banner after reboot",
        "as above, then reboot: the banners exist only in the previous boot's journal",
        Finding(Check.PROFILE_BANNER, Reason.BANNER_STALE),
        runtime_drop_in,
        reboot=True,
    ),
    Control(
        "systemctl set-environment",
        "feature variables only in the manager environment (systemctl set-environment)",
        Finding(Check.MANAGER_ENVIRONMENT, Reason.MANAGER_VARIABLE),
        manager_environment,
    ),
    Control(
        "unit changed, not restarted",
        "target unit written and daemon-reloaded, service not restarted",
        Finding(Check.NOT_RESTARTED, Reason.ARGV_DIFFERS),
        not_restarted,
    ),
    Control(
        "unit changed, not reloaded",
        "target unit written to /etc, no daemon-reload, no restart",
        Finding(Check.NOT_RELOADED, Reason.NEED_DAEMON_RELOAD),
        not_reloaded,
    ),
    Control(
        "banner without its switch",
        "a durable drop-in echoes the SDPA streaming banner; the env var is not set",
        Finding(Check.CONSISTENCY, Reason.CLAIM_WITHOUT_SWITCH),
        lying_banner,
    ),
    Control(
        "engine runs without prefix caching",
        "argv, module banner and echoed banners claim prefix caching; a model build without "
        "supports_prefix_caching makes the TT plugin switch it off in the engine",
        Finding(Check.SERVER_CACHE_CONFIG, Reason.SERVER_DIFFERS),
        engine_without_prefix_caching,
    ),
    Control(
        "env file under /run",
        f"feature variables only in docker run --env-file {RUN_ENV_FILE} (environmentFiles)",
        Finding(Check.PROVENANCE, Reason.RUNTIME_ENV_FILE),
        env_file_under_run,
    ),
    Control(
        "wrapper script sources /run",
        f"durable ExecStart wrapper {WRAPPER} sources its flags from {RUN_FLAGS_FILE}",
        Finding(Check.PROVENANCE, Reason.RUNTIME_SOURCED_FILE),
        wrapper_sources_run,
    ),
    Control(
        "unrelated manager variable (false alarm)",
        f"correct configuration plus systemctl set-environment {UNRELATED_VARIABLE}=vi",
        None,
        unrelated_manager_variable,
    ),
    Control(
        "unrelated runtime drop-in (false alarm)",
        f"correct configuration plus {RUNTIME_DROP_IN_DIR}/50-weight.conf with CPUWeight=50",
        None,
        unrelated_runtime_drop_in,
    ),
    Control(
        "hugepages written at runtime",
        "no boot-time hugepage unit; nr_hugepages written by hand",
        Finding(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGES_RUNTIME_ONLY),
        runtime_hugepages,
    ),
    Control(
        "hugepage unit masked",
        f"systemctl mask {HUGEPAGES_UNIT}",
        Finding(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGE_UNIT_MASKED),
        masked_hugepage_unit,
        starts_from="running",
    ),
    Control(
        "serving unit not enabled",
        f"systemctl disable {SERVING_UNIT} (still running)",
        Finding(Check.NOT_ENABLED, Reason.NOT_ENABLED),
        not_enabled,
        starts_from="running",
    ),
    Control(
        "server started by hand",
        "unit stopped; the validated server started by hand with setsid nohup",
        Finding(Check.OUTSIDE_UNIT, Reason.OUTSIDE_UNIT),
        hand_started,
        starts_from="installed",
        settle=False,
    ),
    Control(
        "transient unit",
        "no durable unit; the server runs under systemd-run --unit (unit file under /run)",
        Finding(Check.RUNTIME_UNIT_FILE, Reason.RUNTIME_UNIT_FILE),
        transient_unit,
    ),
)


# ---- running ---------------------------------------------------------------------------------


def reset_to_target(
    machine: Machine,
    switch: ReferenceSwitch,
    *,
    to: Literal["clean", "installed", "running"] = "running",
) -> None:
    """Undo every control's mechanism; then install the correct target configuration
    (``installed``, the unit stopped) and start it (``running``), or neither (``clean``).

    A container left behind is stopped gracefully and removed once stopped, never ``rm -f``.
    The files it removes are left to the next ``daemon-reload``, the install's (each reload
    costs seconds under TCG); after ``clean`` the control's own mechanism reloads first (it
    installs units, or reloads itself as ``transient_unit`` does).
    """
    names = " ".join(env_name(feature) for feature in ENV_FEATURES)
    timeout = switch.target.stop_timeout
    machine.succeed(
        # A stopped transient unit that failed stays loaded (and blocks `systemctl enable`)
        # until its failure is reset.
        f"systemctl stop {SERVING_UNIT} 2>&1; systemctl reset-failed {SERVING_UNIT} 2>/dev/null; "
        f"if {BACKEND} container inspect {SERVING_CONTAINER} >/dev/null 2>&1; then "
        f"{BACKEND} stop -t {timeout} {SERVING_CONTAINER}; {BACKEND} rm {SERVING_CONTAINER}; fi; "
        f"if [ -s {HAND_PID_FILE} ]; then kill $(cat {HAND_PID_FILE}) 2>/dev/null; "
        f"rm -f {HAND_PID_FILE}; fi; "
        f"rm -rf {RUNTIME_DROP_IN_DIR} {DURABLE_DROP_IN_DIR} /run/systemd/system/{SERVING_UNIT} "
        f"/run/systemd/transient/{SERVING_UNIT}; "
        f"systemctl unmask --no-reload {HUGEPAGES_UNIT} 2>&1; "
        f"rm -f {VENDOR_UNIT_DIR}/{HUGEPAGES_UNIT}; "
        f"systemctl unset-environment {names} {UNRELATED_VARIABLE}; "
        # Only the controls' own files: the unit's image load stamp lives in the same directory
        # (modules/tenstorrent-serving.nix, loadImage) and survives until reboot, as in use.
        f"rm -f {RUN_ENV_FILE} {RUN_FLAGS_FILE} {WRAPPER}; true",
        timeout=UNIT_RESTART_TIMEOUT,
    )
    set_stub_knobs(machine)
    health = f"http://127.0.0.1:{switch.target.port}/health"
    machine.wait_until_succeeds("! curl -s -m 2 -o /dev/null %s", health, timeout=60)
    if to != "clean":
        install_units(machine, switch.target, restart=to == "running")


def evaluate_machine(
    machine: Machine, switch: ReferenceSwitch, label: str
) -> tuple[Snapshot, list[CheckResult]]:
    """Snapshot the machine and run every single-snapshot check against the switch's profile.

    No control concerns the card (the scenario checks it), so the snapshot leaves out tt-smi.
    """
    snapshot = take_snapshot(
        machine, label, port=switch.target.port, container=SERVING_CONTAINER, card=False
    )
    return snapshot, evaluate_stage(switch.profile, snapshot)


def run_control(machine: Machine, switch: ReferenceSwitch, control: Control) -> ControlOutcome:
    """Reset to the target, apply ``control``, (reboot,) check; report whether it was caught."""
    start = time.monotonic()
    with log.nested(f"negative control: {control.name}"):
        reset_to_target(machine, switch, to=control.starts_from)
        control.apply(machine, switch)
        label = "S1"
        if control.reboot:
            # Reboot a server that has started, as an operator would: a container still
            # starting up has no SIGTERM handler yet (PID 1 ignores the signal), so the
            # shutdown would wait out the stop timeout and then kill it.
            _settle(machine, switch)
            machine.reboot()
            label = "S2"
        # Let the server finish starting so that only the control's own fault shows.
        if control.settle:
            _settle(machine, switch)
        snapshot, results = evaluate_machine(machine, switch, label)
        outcome = judge(control.name, control.mechanism, control.finds, results, snapshot)
        outcome.seconds = time.monotonic() - start
        log.info(f"{'detected' if outcome.detected else 'NOT DETECTED'}: {outcome.message}")
    return outcome


def _settle(machine: Machine, switch: ReferenceSwitch) -> None:
    """Wait for the unit and /health; a control may keep them from coming up (a warning)."""
    try:
        wait_ready(machine, switch.target.port, SETTLE_TIMEOUT)
    except DriverError as error:
        log.warning(f"service not ready after applying the control: {error}")


CORRECT_CONFIGURATION = Control(
    "correct configuration",
    "the target configuration as the reference switch installs it, nothing changed",
    None,
    lambda machine, switch: None,
    starts_from="running",
)
"""Not a control but the baseline of them all: the correct configuration raises no alarm."""


def check_correct_configuration(machine: Machine, switch: ReferenceSwitch) -> ControlOutcome:
    """Install the correct target and check it: every failure is a false alarm."""
    with log.nested(f"correct configuration of {switch.profile.name}: expecting no alarm"):
        return run_control(machine, switch, CORRECT_CONFIGURATION)
