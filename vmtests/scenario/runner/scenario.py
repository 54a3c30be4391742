"""The persistence scenario: S0 base -> switch -> S1 -> reboot -> S2, and what must hold.

- S1 satisfies the profile, its banners agree with its argv/env, and nothing live comes from a
  runtime-only source; the switch restarted the unit (InvocationID changed) and, where the
  switch names the NixOS system it must activate (``Switcher.expected_system``), S1 runs it;
- the reboot began a new boot (boot_id changed);
- S2 satisfies the profile the same way and equals S1 on every durable field.

A failed S1 ends the run there: a reboot cannot make a switch that did not take persist, and on a
real host it would restart production on a broken configuration. Whenever a stage fails, or the
run breaks, the evidence a person would ssh in for is collected
(``vmtests.scenario.collection.evidence``) into the result.

With ``preflight``, the run first asks everything that would make it fail for another reason
(``preflight.py``) and refuses before anything changes; it then records the generation the
machine runs (``Switcher.record_generation``), and a run that fails, breaks or is interrupted goes
back to it or leaves the machine as it is (``recovery.py``), saying how to go back either way.

``Scenario.check`` is ``vmtests check``: one snapshot of the machine as it is, every
single-snapshot check, no switch, no reboot, no restart. ``until`` ends the run after a stage's
checks (``vmtests shell`` brings a machine to that stage this way).

Every wait is bounded by the run's settings (``ready_timeout``, ``reboot_timeout``: the
environment's, a host's file's or the target's options, ``vmtests.guest.host_settings``).
Banners count only from the unit's current start in the current boot (see ``Snapshot``). Every
step is timed through the nested logger and in ``ScenarioResult.steps``; the result is filled
as the run goes, so a caller can write a report from it even when the run fails or is
interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field, replace
from enum import StrEnum

from vmtests.contracts import deadline
from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.serving import SERVING_UNIT
from vmtests.contracts.settings import Settings, settings
from vmtests.contracts.status import RunStatus
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.profiles import Profile
from vmtests.scenario.collection.collect import take_snapshot
from vmtests.scenario.collection.evidence import collect_evidence
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.install.generations import Generation
from vmtests.scenario.install.switching import Switcher, wait_ready
from vmtests.scenario.judgement.checks import check_profile, check_service, evaluate_stage
from vmtests.scenario.judgement.compare import (
    FieldDiff,
    check_durable,
    check_rebooted,
    check_restarted,
    check_switched_system,
    diff_snapshots,
)
from vmtests.scenario.judgement.results import CheckResult, as_informational, failed
from vmtests.scenario.runner.metering import DriverMeter
from vmtests.scenario.runner.preflight import PREFLIGHT, PreflightRefused, run_preflight
from vmtests.scenario.runner.recovery import Action, OnFailure, Recovery, recover
from vmtests.scenario.runner.versions import (
    NixosColumn,
    VersionTable,
    read_versions,
    stands_in_for,
)

CHECK = "check"
"""The stage label of ``vmtests check``'s one snapshot."""
STAGES = ("S0", "S1", "S2")
"""The scenario's stages in order: the base (S0), switched (S1), rebooted (S2); ``until`` takes
one of them."""
ROLLBACK_STAGE = "rollback"
"""The stage label of the snapshot taken after a rollback."""


class Kind(StrEnum):
    """What ran: the persistence scenario, or the read-only check."""

    RUN = "run"
    CHECK = "check"


@dataclass
class ScenarioResult:
    """Everything a report needs; filled step by step."""

    profile: Profile
    target: str
    switch: str
    kind: Kind = Kind.RUN
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    diffs: list[FieldDiff] = field(default_factory=list)
    steps: dict[str, float] = field(default_factory=dict)
    meter: DriverMeter = field(default_factory=DriverMeter)
    wall_seconds: float = 0.0
    status: RunStatus = RunStatus.RUNNING
    error: str = ""
    console_logs: list[str] = field(default_factory=list)
    expected_system: str | None = None
    accelerator: dict[str, str] = field(default_factory=dict)
    """Which accelerator ran a QEMU guest, which was asked for, and why (empty elsewhere)."""
    stopped_at: str = ""
    """The stage after which the run stopped early (``S1``: it failed, so no reboot)."""
    evidence: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per stage that failed (or ``error``), the evidence parts: name -> text."""
    settings: Settings = field(default_factory=Settings)
    """The run's settings (timeouts, container, API key file, ...) and where each came from."""
    preflight: list[CheckResult] = field(default_factory=list)
    """The preflight's items (``preflight.*`` checks), asked before anything changed."""
    versions: dict[str, str] = field(default_factory=dict)
    """The versions the run used (``versions.VERSION_COMMANDS``: systemd, Docker, containerd,
    kernel, vLLM, tt-smi, nixos-rebuild), asked by the preflight or, without one, alone."""
    nixos_versions: NixosColumn | None = None
    """Those of the NixOS configuration the run stands in for (``versions.stands_in_for``)."""
    generation: Generation | None = None
    """What the machine ran before the switch (recorded after the preflight)."""
    recovery: Recovery | None = None
    """What was done after a failure: rolled back, or left, and the command that goes back."""

    @property
    def version_table(self) -> VersionTable:
        """The run's versions next to NixOS's, as every report shows them."""
        return VersionTable(self.versions, self.nixos_versions)

    @property
    def switched_system(self) -> str | None:
        """The NixOS system that ran after the switch (S1's ``/run/current-system``)."""
        after = self.snapshots.get("S1")
        return after.generations.get("/run/current-system") if after else None

    @property
    def failures(self) -> list[CheckResult]:
        """Results that fail the run."""
        return [check for check in self.checks if check.failed]

    @property
    def ok(self) -> bool:
        """True when the run finished and no check failed."""
        return self.status == RunStatus.FINISHED and not self.failures and not self.error


@dataclass
class Scenario:
    """Runs the scenario (or the check) on one machine; ``result`` is valid at every moment.

    ``switcher`` is None only for a check of a machine as it is. ``base_profile``, when given,
    is checked at S0 (the base must really be the base); ``settings`` bound every wait and name
    the container, port and API key file; ``start_machine=False`` runs on a machine already
    started. With ``preflight``, the run refuses what would fail for another reason and records
    the generation to go back to, as ``on_failure`` (``rollback_command`` overriding how).
    ``until`` (one of ``STAGES``) ends the run once that stage is checked, the machine left
    there: S0 after the base's snapshot, S1 after the switch's, S2 (the default) after the
    reboot's, which is the whole run.
    """

    machine: Machine
    profile: Profile
    switcher: Switcher | None
    _: KW_ONLY
    target: str = ""
    base_profile: Profile | None = None
    settings: Settings = field(default_factory=settings)
    start_machine: bool = True
    preflight: bool = False
    on_failure: OnFailure = OnFailure.LEAVE
    rollback_command: str | None = None
    until: str = STAGES[-1]
    result: ScenarioResult = field(init=False)

    def __post_init__(self) -> None:
        if self.until not in STAGES:
            raise ValueError(f"until must be one of {', '.join(STAGES)}, not {self.until!r}")
        meter = DriverMeter()
        self._stop_metering = self.machine.observe(meter.record)
        self._switched = False
        switcher = self.switcher
        self.result = ScenarioResult(
            self.profile,
            self.target or self.machine.name,
            switcher.description if switcher else "none (read-only)",
            meter=meter,
            expected_system=switcher.expected_system if switcher else None,
            settings=self.settings,
        )

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A timed step: logged nested and added to ``result.steps`` (even if it fails)."""
        start, outer = time.monotonic(), deadline.current_step()
        deadline.entered(name)
        try:
            with log.nested(name):
                yield
        finally:
            deadline.entered(outer)
            self.result.steps[name] = self.result.steps.get(name, 0.0) + (time.monotonic() - start)

    def snapshot(self, label: str) -> Snapshot:
        """Take and keep snapshot ``label``."""
        with self.step(f"snapshot {label}"):
            snap = take_snapshot(
                self.machine,
                label,
                port=self.settings.serving_port,
                container=self.settings.container,
                api_key_file=self.settings.api_key_file,
                container_log=self.result.kind == Kind.CHECK,
            )
            self.result.snapshots[label] = snap
            for error in snap.errors:
                log.warning(f"{label}: {error}")
        return snap

    def _wait_ready(self, stage: str, what: str, timeout: float | None = None) -> None:
        """Wait for the service; a timeout becomes a failed check, not an abort."""
        timeout = self.settings.ready_timeout if timeout is None else timeout
        try:
            wait_ready(self.machine, self.settings.serving_port, timeout)
        except DriverError as error:
            self.result.checks.append(
                failed(
                    stage,
                    Check.SERVICE_READY,
                    SERVING_UNIT,
                    Reason.NOT_READY,
                    f"{what} (ready_timeout {timeout:g} s): {error}",
                )
            )

    def _record(self, name: str, results: list[CheckResult], stage: str = "") -> None:
        with self.step(name):
            self.result.checks.extend(results)
            for result in results:
                if result.failed:
                    log.warning(str(result))
            bad = sum(r.failed for r in results)
            log.info(f"{len(results)} checks, {bad} failed")
        if stage and any(r.failed for r in self.result.checks if r.stage == stage):
            self.collect_evidence(stage)

    def collect_evidence(self, stage: str) -> None:
        """Collect the evidence for ``stage`` once (a failed stage, or ``error``)."""
        if stage not in self.result.evidence:
            with self.step(f"evidence {stage}"):
                self.result.evidence[stage] = collect_evidence(
                    self.machine, container=self.settings.container
                )

    def run(self) -> ScenarioResult:
        """Run every step; returns the result (also available as ``self.result``)."""
        return self._execute(self._run)

    def check(self) -> ScenarioResult:
        """The read-only check; returns the result (also available as ``self.result``)."""
        self.result.kind = Kind.CHECK
        return self._execute(self._check)

    def _execute(self, body: Callable[[], None]) -> ScenarioResult:
        start = time.monotonic()
        try:
            # Before anything else, so that a run that stops early still names its NixOS.
            with self.step("nixos versions"):
                self.result.nixos_versions = stands_in_for(
                    self.profile.serving_profile, self.result.target
                )
            body()
            self.result.status = RunStatus.FINISHED
        except PreflightRefused as refused:
            self.result.status, self.result.error = RunStatus.REFUSED, str(refused)
            raise
        except KeyboardInterrupt as interrupt:
            self.result.status = RunStatus.INTERRUPTED
            self.result.error = (
                str(interrupt)
                if isinstance(interrupt, deadline.DeadlineExceeded)
                else "interrupted (Ctrl-C)"
            )
            self.collect_evidence("interrupted")
            self._recover()
            raise
        except Exception as error:
            self.result.status = RunStatus.ERROR
            self.result.error = f"{type(error).__name__}: {error}"
            self.collect_evidence("error")
            self._recover()
            raise
        finally:
            self._stop_metering()
            self.result.wall_seconds = time.monotonic() - start
        if self.result.failures:
            self._recover()
        return self.result

    @property
    def switched(self) -> bool:
        """Whether the run began the switch (the machine may be on another generation now)."""
        return self._switched

    def _recover(self) -> None:
        """After a failure: go back to the recorded generation, or leave (``on_failure``)."""
        self.go_back(self.on_failure)

    def go_back(self, on_failure: OnFailure = OnFailure.ROLLBACK) -> None:
        """Go back to the generation recorded before the switch (or, ``LEAVE``, say how),
        whatever the checks said, once: ``vmtests shell`` on leaving a host it switched. Nothing
        to do when nothing was switched, no generation was recorded, or a recovery ran."""
        generation = self.result.generation
        if self.result.recovery is not None or generation is None or not self._switched:
            return
        with self.step("recovery"):
            self.result.recovery = recover(
                self.machine,
                generation,
                on_failure=on_failure,
                command=self.rollback_command,
                settings=self.settings,
            )
        if self.result.recovery.action in {Action.ROLLED_BACK, Action.NOT_SERVING}:
            snap = self.snapshot(ROLLBACK_STAGE)
            checks = check_service(snap)
            if self.base_profile is not None:
                checks += check_profile(self.base_profile, snap)
            self._record(f"checks {ROLLBACK_STAGE}", checks)

    def _preflight(self, switcher: Switcher) -> None:
        """Refuse, before anything changes, what would fail for another reason; then record
        the generation the machine runs."""
        with self.step("preflight"):
            found = run_preflight(self.machine, self.profile, switcher, self.settings)
            self.result.preflight, self.result.versions = found.items, found.versions
            log.info(f"found: {found.versions_line()}")
            if found.refusal is not None:
                raise PreflightRefused(found.refusal)
        with self.step("record generation"):
            try:
                self.result.generation = switcher.record_generation(self.machine)
            except DriverError as error:
                # Going back needs the recorded generation (a --rollback-command too, which is
                # given it as {generation}): without it, a host that must go back is not switched.
                if self.on_failure == OnFailure.ROLLBACK:
                    item = CheckResult(
                        PREFLIGHT, Check.PREFLIGHT_GENERATION, "generation", False,
                        str(error), reason=Reason.NO_GENERATION,
                    )  # fmt: skip
                    self.result.preflight.append(item)
                    raise PreflightRefused(item) from error
                log.warning(f"no generation recorded: {error}")
                return
            log.info(f"recorded {self.result.generation.description}")

    def _check(self) -> None:
        profile = self.profile
        with log.nested(f"read-only check: profile {profile.name} on {self.result.target}"):
            if self.start_machine:
                with self.step("boot"):
                    self.machine.start()
            if self.switcher is not None:
                with self.step("deploy"):
                    self.switcher.prepare_base(self.machine)
            self._await_start()
            self._read_versions()
            snapshot = self.snapshot(CHECK)
            self._record("checks", evaluate_stage(profile, snapshot), stage=CHECK)

    def _read_versions(self) -> None:
        """The versions the run uses, when no preflight asked them (one round trip)."""
        with self.step("versions"):
            self.result.versions = read_versions(self.machine, self.settings.serving_port)
            log.info(f"versions: {VersionTable(self.result.versions).run_line()}")

    def _await_start(self) -> None:
        """A server still within its ready budget since its unit started gets the rest of it
        (a host that just booted); any other state is checked as it is."""
        state = self.machine.execute(
            "systemctl show -p ActiveState -p ActiveEnterTimestampMonotonic %s && "
            "cut -d' ' -f1 /proc/uptime",
            SERVING_UNIT,
            timeout=30,
        ).stdout_text
        values = dict(line.split("=", 1) for line in state.splitlines() if "=" in line)
        uptime = state.split()[-1] if state.split() else "0"
        entered = int(values.get("ActiveEnterTimestampMonotonic", "0") or 0) / 1e6
        age = float(uptime) - entered if uptime.replace(".", "", 1).isdigit() else 0.0
        budget = self.settings.ready_timeout - age
        if values.get("ActiveState") in {"active", "activating"} and budget > 0:
            healthy = self.machine.execute(
                "curl -sf -m 5 -o /dev/null http://127.0.0.1:%s/health",
                self.settings.serving_port,
                timeout=30,
            )
            if healthy.rc != 0:
                with self.step("wait for the server"):
                    self._wait_ready(CHECK, "the server did not finish starting", budget)

    def _run(self) -> None:
        profile, switcher = self.profile, self.switcher
        if switcher is None:
            raise ValueError("the persistence scenario needs a switch")
        with log.nested(f"persistence scenario: profile {profile.name} on {self.result.target}"):
            if self.start_machine:
                with self.step("boot"):
                    self.machine.start()
            with self.step("prepare base"):
                switcher.prepare_base(self.machine)
            if self.preflight:
                self._preflight(switcher)
            else:
                self._read_versions()
            s0 = self.snapshot("S0")
            checks = as_informational(evaluate_stage(profile, s0))
            if self.base_profile is not None:
                checks += [replace(r, base=True) for r in check_profile(self.base_profile, s0)]
            self._record("checks S0", checks)
            if self.until == "S0":
                return
            with self.step("switch"):
                self._switched = True
                switcher.switch(self.machine, profile)
                self._wait_ready("S1", "the service did not come up after the switch")
            s1 = self.snapshot("S1")
            self._record(
                "checks S1",
                evaluate_stage(profile, s1)
                + check_restarted(s0, s1)
                + check_switched_system(s1, self.result.expected_system),
                stage="S1",
            )
            if self.result.failures:
                self.result.stopped_at = "S1"
                log.warning("S1 failed: the machine is not rebooted (the evidence is collected)")
                return
            if self.until == "S1":
                return
            with self.step("reboot"):
                self.machine.reboot(self.settings.reboot_timeout)
                self._wait_ready("S2", "the service did not come back after the reboot")
            s2 = self.snapshot("S2")
            with self.step("compare S1/S2"):
                self.result.diffs = diff_snapshots(s1, s2, profile)
            self._record(
                "checks S2",
                evaluate_stage(profile, s2, previous=s1)
                + check_rebooted(s1, s2)
                + check_durable(s1, s2, profile),
                stage="S2",
            )
