"""The persistence scenario: S0 base -> switch -> S1 -> reboot -> S2, and what must hold.

- S1 satisfies the profile, its banners agree with its argv/env, and nothing live comes from a
  runtime-only source; the switch restarted the unit (InvocationID changed) and, where the
  switch names the NixOS system it must activate (``Switcher.expected_system``), S1 runs it;
- the reboot began a new boot (boot_id changed);
- S2 satisfies the profile the same way and equals S1 on every durable field.

A failed S1 ends the run there: a reboot cannot make a switch that did not take persist, and on a
real host it would restart production on a broken configuration. Whenever a stage fails, or the
run breaks, the evidence a person would ssh in for is collected (``evidence.py``) into the result.

Banners count only from the unit's current start in the current boot (see ``Snapshot``). Every
step is timed through the nested logger and in ``ScenarioResult.steps``; the result is filled
as the run goes, so a caller can write a report from it even when the run fails or is
interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field, replace

from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.serving import READY_TIMEOUT, SERVING_PORT, SERVING_UNIT
from vmtests.contracts.status import RunStatus
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.profiles import Profile
from vmtests.scenario.collection.collect import take_snapshot
from vmtests.scenario.collection.evidence import collect_evidence
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.install.switching import Switcher, wait_ready
from vmtests.scenario.judgement.checks import check_profile, evaluate_stage
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


@dataclass
class ScenarioResult:
    """Everything a report needs; filled step by step."""

    profile: Profile
    target: str
    switch: str
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
    """Runs the scenario on one machine; ``result`` is valid at every moment.

    ``base_profile``, when given, is checked at S0 (the base must really be the base);
    ``container`` names the serving container the snapshots inspect; ``api_key_file`` the file
    on the machine holding the server's API key; ``start_machine=False`` runs on a machine
    already started.
    """

    machine: Machine
    profile: Profile
    switcher: Switcher
    _: KW_ONLY
    target: str = ""
    base_profile: Profile | None = None
    port: int = SERVING_PORT
    container: str | None = None
    start_machine: bool = True
    api_key_file: str | None = None
    result: ScenarioResult = field(init=False)

    def __post_init__(self) -> None:
        meter = DriverMeter()
        self._stop_metering = self.machine.observe(meter.record)
        self.result = ScenarioResult(
            self.profile,
            self.target or self.machine.name,
            self.switcher.description,
            meter=meter,
            expected_system=self.switcher.expected_system,
        )

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A timed step: logged nested and added to ``result.steps`` (even if it fails)."""
        start = time.monotonic()
        try:
            with log.nested(name):
                yield
        finally:
            self.result.steps[name] = self.result.steps.get(name, 0.0) + (time.monotonic() - start)

    def snapshot(self, label: str) -> Snapshot:
        """Take and keep snapshot ``label``."""
        with self.step(f"snapshot {label}"):
            snap = take_snapshot(
                self.machine,
                label,
                port=self.port,
                container=self.container,
                api_key_file=self.api_key_file,
            )
            self.result.snapshots[label] = snap
            for error in snap.errors:
                log.warning(f"{label}: {error}")
        return snap

    def _wait_ready(self, stage: str, what: str, timeout: float) -> None:
        """Wait for the service; a timeout becomes a failed check, not an abort."""
        try:
            wait_ready(self.machine, self.port, timeout)
        except DriverError as error:
            self.result.checks.append(
                failed(
                    stage, Check.SERVICE_READY, SERVING_UNIT, Reason.NOT_READY, f"{what}: {error}"
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
        failed_here = any(r.failed for r in self.result.checks if r.stage == stage)
        if stage and failed_here:
            self.collect_evidence(stage)

    def collect_evidence(self, stage: str) -> None:
        """Collect the evidence for ``stage`` once (a failed stage, or ``error``)."""
        if stage not in self.result.evidence:
            with self.step(f"evidence {stage}"):
                self.result.evidence[stage] = collect_evidence(
                    self.machine, container=self.container
                )

    def run(self) -> ScenarioResult:
        """Run every step; returns the result (also available as ``self.result``)."""
        start = time.monotonic()
        try:
            self._run()
            self.result.status = RunStatus.FINISHED
        except KeyboardInterrupt:
            self.result.status = RunStatus.INTERRUPTED
            self.result.error = "interrupted (Ctrl-C)"
            self.collect_evidence("interrupted")
            raise
        except Exception as error:
            self.result.status = RunStatus.ERROR
            self.result.error = f"{type(error).__name__}: {error}"
            self.collect_evidence("error")
            raise
        finally:
            self._stop_metering()
            self.result.wall_seconds = time.monotonic() - start
        return self.result

    def _run(self) -> None:
        profile = self.profile
        with log.nested(f"persistence scenario: profile {profile.name} on {self.result.target}"):
            if self.start_machine:
                with self.step("boot"):
                    self.machine.start()
            with self.step("prepare base"):
                self.switcher.prepare_base(self.machine)
            s0 = self.snapshot("S0")
            checks = as_informational(evaluate_stage(profile, s0))
            if self.base_profile is not None:
                checks += [replace(r, base=True) for r in check_profile(self.base_profile, s0)]
            self._record("checks S0", checks)
            with self.step("switch"):
                self.switcher.switch(self.machine, profile)
                self._wait_ready(
                    "S1", "the service did not come up after the switch", READY_TIMEOUT
                )
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
            with self.step("reboot"):
                self.machine.reboot()
                self._wait_ready(
                    "S2", "the service did not come back after the reboot", READY_TIMEOUT
                )
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
