"""The negative controls: real ways a configuration fails to persist, or its evidence fails (a
journal that dropped the banners), each of which must be caught.

Every control starts from the correct target configuration (installed by the reference switch),
applies one real mechanism on the reference guest (a ``/run`` drop-in, ``systemctl
set-environment``, a hand-started server, ...), snapshots the machine (after a reboot when the
failure only shows then) and runs the ordinary checks (``vmtests.scenario.controls.reset``).
Each control is one entry here: its mechanism, declared with ``CATALOGUE.control``
(``vmtests.scenario.controls.control``):

- ``finds``: the finding it must produce (a ``Check`` and a ``Reason``,
  ``vmtests.contracts.findings``), and ``also`` what its mechanism cannot help breaking besides;
  it is *detected* when the failures carry them, whatever the messages say. A false-alarm
  control declares none and is detected when nothing fails; so is the correct configuration;
- ``footprint``: what it leaves on the guest (files, units, manager variables, stub knobs,
  containers, processes); the reset takes away the union of all footprints (``EVERY_FOOTPRINT``);
- ``effect``: its mechanism applied to a snapshot (``vmtests.scenario.controls.effects``), with
  which a test that needs no VM proves the declared findings on a recorded snapshot.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace
from functools import reduce

from vmtests.contracts.features import banner_text, env_name
from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.contracts.serving import (
    HUGEPAGES_UNIT,
    SERVING_CONTAINER,
    SERVING_UNIT,
    Hugepages,
    hugepages_path,
)
from vmtests.driver.machine import Machine
from vmtests.guest.stub_layer import GUEST_PYTHONPATH, set_stub_knobs
from vmtests.scenario.controls import effects
from vmtests.scenario.controls.control import Apply, Catalogue, Control, Declaration, Footprint
from vmtests.scenario.controls.places import (
    BANNER_DROP_IN,
    FEATURE_VARIABLES,
    HAND_LOG,
    HAND_PID_FILE,
    LOG_FLOOD_LINES,
    LOG_RATE_LIMIT_BURST,
    LOG_RATE_LIMIT_DROP_IN,
    MODEL_BUILD_DROP_IN,
    RUN_ENV_FILE,
    RUN_FLAGS_FILE,
    RUNTIME_DROP_IN,
    UNRELATED_DROP_IN,
    UNRELATED_VARIABLE,
    VENDOR_UNIT_DIR,
    WRAPPER,
    WRAPPER_DROP_IN,
)
from vmtests.scenario.install.reference_switch import (
    UNIT_DIR,
    UNIT_RESTART_TIMEOUT,
    InstallStage,
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
from vmtests.scenario.install.serving_unit import RenderedUnits, run_script_text
from vmtests.scenario.install.switching import wait_healthy
from vmtests.stub import knobs, release

CATALOGUE = Catalogue()
CRASH_AFTER_SECONDS = 30
"""How long the restarting control's first start serves before its engine dies: long enough
for this side to see it answer and take the knob away before the restart reads it again."""
CRASH_TIMEOUT = 120.0
"""Seconds the restarting control waits for the restart: the crash, and the margin a loaded
two-core host needs."""
SUPPRESSION_TIMEOUT = 120.0
"""Seconds the flooded-journal control waits for journald's ``Suppressed`` line: its interval
(20 s) and the unit's next line, with the margin a loaded two-core host needs."""


def _feature_free(switch: ReferenceSwitch) -> ServingConfig:
    """The target's units with the base's argv, environment and banner (hugepages kept)."""
    base = switch.base
    return replace(switch.target, args=base.args, environment=base.environment, banner=base.banner)


def _restart(machine: Machine, config: ServingConfig) -> None:
    """Reload once (the units staged, the control's own files written) and restart."""
    machine.succeed("systemctl daemon-reload", timeout=UNIT_RESTART_TIMEOUT)
    restart_serving(machine, config)


def _correct_plus(
    machine: Machine, switch: ReferenceSwitch, unrelated: Callable[[], object]
) -> None:
    """The correct target staged, then ``unrelated`` (state that does not configure serving),
    then one reload and restart."""
    stage_units(machine, switch.target)
    unrelated()
    _restart(machine, switch.target)


def _durable_drop_in(machine: Machine, path: str, settings: list[str]) -> None:
    """Write a ``[Service]`` drop-in of the serving unit under /etc (durable)."""
    machine.write_file(path, "\n".join(["[Service]", *settings, ""]))


def _exec_lines(machine: Machine, config: ServingConfig) -> list[str]:
    """The ExecStart/ExecStartPre/Environment lines of ``config``'s serving unit.

    Its scripts are written to the store directory (not its unit files), so that a drop-in
    can point at them, as a hand-made drop-in would point at store paths on NixOS.
    """
    rendered = render_units(config)
    write_rendered(machine, RenderedUnits(scripts=rendered.scripts))
    keep = ("ExecStart=", "ExecStartPre=", "Environment=")
    return [line for line in rendered.units[SERVING_UNIT].splitlines() if line.startswith(keep)]


@CATALOGUE.control(
    "stale banner after reboot", Finding(Check.PROFILE_BANNER, Reason.BANNER_STALE),
    effects.stale_banner, files=[RUNTIME_DROP_IN],
    mechanism="the runtime drop-in, then a reboot: its banners exist only in the previous boot's "
    "journal",
    reboot=True,
)  # fmt: skip
@CATALOGUE.control(
    "runtime drop-in", Finding(Check.RUNTIME_DROP_IN, Reason.RUNTIME_DROP_IN),
    effects.runtime_drop_in, files=[RUNTIME_DROP_IN],
)  # fmt: skip
def runtime_drop_in(machine: Machine, switch: ReferenceSwitch) -> None:
    """The durable unit lacks the features; a drop-in under /run adds them (lost at reboot)."""
    config = _feature_free(switch)
    stage_units(machine, config)
    exec_lines = _exec_lines(machine, switch.target)
    lines = ["[Service]", "ExecStartPre=", "ExecStart=", *exec_lines, ""]
    machine.write_file(RUNTIME_DROP_IN, "\n".join(lines))
    _restart(machine, config)


@CATALOGUE.control(
    "systemctl set-environment", Finding(Check.MANAGER_ENVIRONMENT, Reason.MANAGER_VARIABLE),
    effects.manager_environment, manager_variables=FEATURE_VARIABLES,
)  # fmt: skip
def manager_environment(machine: Machine, switch: ReferenceSwitch) -> None:
    """The unit lacks the feature variables; ``systemctl set-environment`` supplies them."""
    config = switch.target.without_env(*FEATURE_VARIABLES)
    stage_units(machine, config)
    assignments = [
        f"{k}={v}" for k, v in switch.target.environment.items() if k in FEATURE_VARIABLES
    ]
    machine.succeed("systemctl set-environment %s", assignments)
    _restart(machine, config)


def _switched_until(stage: InstallStage) -> Apply:
    """A mechanism: the feature-free unit runs, then the target's unit is installed only as far
    as ``stage`` (written, or also reloaded), and the running service is left alone."""

    def switch_partly(machine: Machine, switch: ReferenceSwitch) -> None:
        install_units(machine, _feature_free(switch))
        install_units(machine, switch.target, stage)

    return switch_partly


CATALOGUE.control(
    "unit changed, not restarted", Finding(Check.NOT_RESTARTED, Reason.ARGV_DIFFERS),
    effects.not_restarted,
    mechanism="target unit written and daemon-reloaded, service not restarted",
)(_switched_until("reloaded"))  # fmt: skip

CATALOGUE.control(
    "unit changed, not reloaded", Finding(Check.NOT_RELOADED, Reason.NEED_DAEMON_RELOAD),
    effects.not_reloaded,
    mechanism="target unit written to /etc, no daemon-reload, no restart",
)(_switched_until("written"))  # fmt: skip


@CATALOGUE.control(
    "banner without its switch", Finding(Check.CONSISTENCY, Reason.CLAIM_WITHOUT_SWITCH),
    effects.lying_banner, files=[BANNER_DROP_IN],
    # The profile requires the switch the mechanism leaves out.
    also=[Finding(Check.PROFILE_ENV, Reason.ENV_MISSING)],
)  # fmt: skip
def lying_banner(machine: Machine, switch: ReferenceSwitch) -> None:
    """A durable drop-in prints the SDPA streaming banner; the environment lacks the switch."""
    config = switch.target.without_env(env_name("sdpaStreaming"))
    stage_units(machine, config)
    echo = f"ExecStartPre=/bin/echo {systemd_quote(banner_text('sdpaStreaming'))}"
    _durable_drop_in(machine, BANNER_DROP_IN, [echo])
    _restart(machine, config)


@CATALOGUE.control(
    "engine runs without prefix caching",
    Finding(Check.SERVER_CACHE_CONFIG, Reason.SERVER_DIFFERS),
    effects.engine_without_prefix_caching, files=[MODEL_BUILD_DROP_IN],
    stub_knobs=[knobs.MODEL_CAPABILITIES],
)  # fmt: skip
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
    _durable_drop_in(machine, MODEL_BUILD_DROP_IN, lines)
    _restart(machine, config)


@CATALOGUE.control(
    "service restarts on its own while answering",
    Finding(Check.SERVICE_RESTARTS, Reason.UNIT_RESTARTED),
    effects.restarted_on_its_own, stub_knobs=[knobs.CRASH_AFTER],
)  # fmt: skip
def restarts_on_its_own(machine: Machine, switch: ReferenceSwitch) -> None:
    """The correct target whose engine dies once while serving; systemd restarts the unit and
    the new start answers.

    A stub knob makes the server answer, then log the engine's fatal error and exit 1 after
    ``CRASH_AFTER_SECONDS``; the unit's ``Restart=on-failure`` starts it again. The knob is
    taken away once the first start answers: the restart reads the knobs file anew (``docker
    run --env-file``) and serves on. At the snapshot everything answers and holds; only the
    unit's ``NRestarts`` tells.
    """
    config = switch.target
    stage_units(machine, config)
    set_stub_knobs(machine, **{knobs.CRASH_AFTER: str(CRASH_AFTER_SECONDS)})
    _restart(machine, config)
    wait_healthy(machine, config.port)
    set_stub_knobs(machine)
    machine.wait_until_succeeds(
        '[ "$(systemctl show -P NRestarts %s)" -ge 1 ]', SERVING_UNIT, timeout=CRASH_TIMEOUT
    )


@CATALOGUE.control(
    "journal flooded at startup", Finding(Check.SNAPSHOT_EVIDENCE, Reason.JOURNAL_SUPPRESSED),
    effects.journal_flooded, files=[LOG_RATE_LIMIT_DROP_IN], stub_knobs=[knobs.LOG_FLOOD],
)  # fmt: skip
def journal_flooded(machine: Machine, switch: ReferenceSwitch) -> None:
    """A chatty start past journald's rate limit: journald drops the banners and says so.

    The correct target, with a low rate limit for the unit (a durable drop-in:
    ``LogRateLimitIntervalSec=``/``LogRateLimitBurst=``, systemd.exec(5)) and a stub that logs
    thousands of lines before its banners (a stub knob). journald writes ``Suppressed N
    messages from <unit>`` only when the unit logs again after the interval
    (systemd ``journald-rate-limit.c``), so ``/health`` is asked (each answer logs a line) until
    it does. Only that line fails: the banners are found in the container's own log.
    """
    config = switch.target
    stage_units(machine, config)
    set_stub_knobs(machine, **{knobs.LOG_FLOOD: str(LOG_FLOOD_LINES)})
    interval = "20s"
    _durable_drop_in(
        machine,
        LOG_RATE_LIMIT_DROP_IN,
        [f"LogRateLimitIntervalSec={interval}", f"LogRateLimitBurst={LOG_RATE_LIMIT_BURST}"],
    )
    since = machine.succeed("date +%s", timeout=30).strip()
    _restart(machine, config)
    machine.wait_until_succeeds(
        "curl -sf -o /dev/null http://127.0.0.1:%s/health; "
        "journalctl -b 0 -u %s --since @%s -o cat | grep -q '^Suppressed '",
        config.port,
        SERVING_UNIT,
        since,
        timeout=SUPPRESSION_TIMEOUT,
    )


@CATALOGUE.control(
    "env file under /run", Finding(Check.PROVENANCE, Reason.RUNTIME_ENV_FILE),
    effects.env_file_under_run, files=[RUN_ENV_FILE],
)  # fmt: skip
def env_file_under_run(machine: Machine, switch: ReferenceSwitch) -> None:
    """The feature variables reach the container only from a ``--env-file`` under /run.

    As oci-containers renders ``environmentFiles = [ "/run/..." ]``
    (nixpkgs ``nixos/modules/virtualisation/oci-containers.nix``): the unit and the module
    are durable, the file they point at is not.
    """
    values = [f"{k}={v}" for k, v in switch.target.environment.items() if k in FEATURE_VARIABLES]
    machine.write_file(RUN_ENV_FILE, "\n".join([*values, ""]))
    config = replace(
        switch.target.without_env(*FEATURE_VARIABLES),
        environment_files=(RUN_ENV_FILE,),
    )
    install_units(machine, config, "restarted")


@CATALOGUE.control(
    "wrapper script sources /run", Finding(Check.PROVENANCE, Reason.RUNTIME_SOURCED_FILE),
    effects.wrapper_sources_run, files=[RUN_FLAGS_FILE, WRAPPER, WRAPPER_DROP_IN],
)  # fmt: skip
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
    _durable_drop_in(machine, WRAPPER_DROP_IN, ["ExecStart=", f"ExecStart={WRAPPER}"])
    _restart(machine, config)


@CATALOGUE.control(
    "unrelated manager variable (false alarm)", None,
    effects.unrelated_manager_variable, manager_variables=[UNRELATED_VARIABLE],
)  # fmt: skip
def unrelated_manager_variable(machine: Machine, switch: ReferenceSwitch) -> None:
    """The correct configuration plus ``systemctl set-environment EDITOR=vi`` (unrelated)."""
    setting = f"systemctl set-environment {UNRELATED_VARIABLE}=vi"
    _correct_plus(machine, switch, lambda: machine.succeed(setting))


@CATALOGUE.control(
    "unrelated runtime drop-in (false alarm)", None,
    effects.unrelated_runtime_drop_in, files=[UNRELATED_DROP_IN],
)  # fmt: skip
def unrelated_runtime_drop_in(machine: Machine, switch: ReferenceSwitch) -> None:
    """The correct configuration plus a /run drop-in that only sets CPUWeight= (unrelated)."""
    _correct_plus(
        machine, switch, lambda: machine.write_file(UNRELATED_DROP_IN, "[Service]\nCPUWeight=50\n")
    )


@CATALOGUE.control(
    "hugepages written at runtime", Finding(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGES_RUNTIME_ONLY),
    effects.runtime_hugepages,
)  # fmt: skip
def runtime_hugepages(machine: Machine, switch: ReferenceSwitch) -> None:
    """No boot-time hugepage unit; the pages are written to sysfs at runtime."""
    install_units(machine, replace(switch.target, hugepages=None))
    hugepages = switch.target.hugepages or Hugepages(2, "1G")
    machine.succeed(f"echo {hugepages.count} > {hugepages_path(hugepages.size_kib)}")


@CATALOGUE.control(
    "hugepage unit masked", Finding(Check.HUGEPAGE_SOURCE, Reason.HUGEPAGE_UNIT_MASKED),
    effects.masked_hugepage_unit, masked_units=[HUGEPAGES_UNIT],
    files=[f"{VENDOR_UNIT_DIR}/{HUGEPAGES_UNIT}"],
    starts_from="running",
)  # fmt: skip
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


@CATALOGUE.control(
    "serving unit not enabled", Finding(Check.NOT_ENABLED, Reason.NOT_ENABLED),
    effects.not_enabled,
    starts_from="running",
)  # fmt: skip
def not_enabled(machine: Machine, switch: ReferenceSwitch) -> None:
    """The serving unit runs now but is disabled: nothing starts it at the next boot."""
    del switch
    machine.succeed(f"systemctl disable {SERVING_UNIT} 2>&1")


@CATALOGUE.control(
    "server started by hand", Finding(Check.OUTSIDE_UNIT, Reason.OUTSIDE_UNIT),
    effects.hand_started, files=[HAND_LOG], pid_files=[HAND_PID_FILE],
    settle=False,
    starts_from="installed",
)  # fmt: skip
def hand_started(machine: Machine, switch: ReferenceSwitch) -> None:
    """The unit is stopped and the validated server is started by hand, outside systemd."""
    target = switch.target
    machine.succeed(f"systemctl stop {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)
    environment = {"PYTHONPATH": GUEST_PYTHONPATH, **target.environment}
    machine.succeed(
        "env %s setsid nohup python3 -m vmtests.stub.server %s "
        "> %s 2>&1 < /dev/null & echo $! > %s",
        [f"{k}={v}" for k, v in environment.items()],
        target.args,
        HAND_LOG,
        HAND_PID_FILE,
    )
    wait_healthy(machine, target.port, timeout=120)


@CATALOGUE.control(
    "transient unit", Finding(Check.RUNTIME_UNIT_FILE, Reason.RUNTIME_UNIT_FILE),
    # Nothing enables a transient unit.
    also=[Finding(Check.NOT_ENABLED, Reason.NOT_ENABLED)],
    effect=effects.transient_unit, transient_units=[SERVING_UNIT],
)  # fmt: skip
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


CONTROLS: tuple[Control, ...] = CATALOGUE.controls
"""Every negative control, in the order they run."""

CORRECT_CONFIGURATION = Control(
    name="correct configuration",
    mechanism="the target configuration as the reference switch installs it, nothing changed",
    finds=None,
    apply=lambda machine, switch: None,
    effect=effects.no_change,
    starts_from="running",
)
"""Not a control but the baseline of them all: the correct configuration raises no alarm."""

RM_F = Declaration(
    name="leftover container, rm -f pre-start",
    mechanism="a container left running under the unit's name; the unit's pre-start is "
    "oci-containers.nix's own `docker rm -f`",
    finds=Finding(Check.GRACEFUL_STOP, Reason.KILLED),
    footprint=Footprint(containers=frozenset({SERVING_CONTAINER})),
)
"""The container path's control (``vmtests.scenario.controls.container_stop``): its evidence is
Docker's event log, not a snapshot."""

EVERY_FOOTPRINT = reduce(Footprint.__or__, (c.footprint for c in (*CONTROLS, RM_F)), Footprint())
"""Everything any control leaves behind: what the reset takes away."""
