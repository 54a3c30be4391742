"""The certification run: preflight, the gates in order, the report; or the golden recording,
or the determinism probe.

``certify(...)`` never leaves without writing the certificate (``finally``). When the run is
interrupted (Ctrl-C) or an error ends it after it switched or restarted anything, it puts the
host back on the configuration it started from (a checked switch) and says in the report which
configuration the host was left on; a second Ctrl-C, or a failure, during that switch leaves the
report saying it is unknown and which switch was under way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from vmtests.certify import gates, gates_perf, prompts, recording
from vmtests.certify.arms import Configuration
from vmtests.certify.context import Context, Options, spec
from vmtests.certify.determinism import probe
from vmtests.certify.endpoint import serving_endpoint
from vmtests.certify.golden import GOLDEN_DIR, GoldenRecorder, GoldenStore, server_key
from vmtests.certify.loadgen import LoadGenerator, RequestSpec, overhead_summary
from vmtests.certify.model import (
    CERTIFY,
    ERROR,
    PROBE,
    RECORD,
    CertificationResult,
    GateResult,
)
from vmtests.certify.plan import ALL_GATES
from vmtests.certify.report import write_certificate
from vmtests.contracts import deadline
from vmtests.contracts import settings as environment
from vmtests.contracts.settings import Settings
from vmtests.contracts.status import RunStatus
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.profiles import Profile
from vmtests.scenario.collection.collect import read_api_key
from vmtests.scenario.collection.redact import redact_text
from vmtests.scenario.install.switching import Switcher
from vmtests.scenario.judgement.checks import unauthorized_message


def _server_identity(generator: LoadGenerator, api_key_file: str | None) -> tuple[str, str]:
    """(server key for the golden store, served model name) from /version and /v1/models."""
    status, body = generator.get("/version")
    version = json.loads(body).get("version", "?") if status == 200 else "?"
    status, body = generator.get("/v1/models")
    if status == 401:
        raise RuntimeError(unauthorized_message("/v1/models", api_key_file or ""))
    models = json.loads(body).get("data", []) if status == 200 else []
    model = models[0] if models else {}
    model_id, root = str(model.get("id", "?")), str(model.get("root", "?"))
    return server_key(version, model_id, root), model_id


def golden_specs(options: Options) -> list[RequestSpec]:
    """Every fixed greedy request the gates judge against golden values."""
    long_sets = prompts.long_prompts()
    return [
        *(spec(p, options.correctness_tokens) for p in (*prompts.SMOKE, *prompts.EXTENDED)),
        *(spec(p, options.concurrency_tokens) for p in prompts.concurrency_prompts()),
        *(spec(p, options.ab_tokens, options.seed) for p in prompts.ab_prompts()),
        spec(prompts.DECODE, options.decode_tokens),
        *(spec(p, options.long_tokens) for group in long_sets.values() for p in group),
    ]


def _gate_functions(ctx: Context) -> dict[str, Callable[[], GateResult]]:
    ab = recording.ab_outputs if ctx.recorder is not None else gates_perf.ab
    return {
        "smoke": lambda: gates.correctness(ctx, "smoke", prompts.SMOKE),
        "extended": lambda: gates.correctness(ctx, "extended", prompts.EXTENDED),
        "concurrency": lambda: gates.concurrency(ctx),
        "ab": lambda: ab(ctx),
        "decode_b1": lambda: gates_perf.decode_b1(ctx),
        "cold_warm": lambda: gates_perf.cold_warm(ctx),
    }


def _timed(ctx: Context, name: str, run: Callable[[], GateResult]) -> GateResult:
    """Run one gate, log it, and write the certificate so far (kept if the runner dies)."""
    start = time.monotonic()
    deadline.entered(f"gate {name}")
    with log.nested(f"gate {name}"):
        gate = run()
        gate.seconds = time.monotonic() - start
        ctx.result.gates.append(gate)
        log.info(f"{name}: {gate.status}: {redact_text(gate.summary)}")
    if ctx.report_dir is not None:
        write_certificate(ctx.result, ctx.report_dir)
    return gate


def _restore(ctx: Context | None, result: CertificationResult, after: str) -> None:
    """Put the host back on the starting configuration after ``after`` (an interruption or an
    error), when the run changed anything; a failure to do so is added to the result's error."""
    if ctx is None or not ctx.touched or ctx.current == ctx.base.name:
        return
    try:
        with log.nested(f"restoring {ctx.base.name} after {after}"):
            ctx.switch(ctx.base, reason="restore the starting configuration")
    except (KeyboardInterrupt, DriverError, OSError, RuntimeError, ValueError) as error:
        result.error += f"; restoring {ctx.base.name} failed: {type(error).__name__}: {error}"


def certify(
    machine: Machine,
    profile: Profile,
    *,
    target: str,
    switcher: Switcher,
    report_dir: Path,
    options: Options | None = None,
    ab_profile: Profile | None = None,
    mode: str = CERTIFY,
    settings: Settings | None = None,
    golden_dir: Path = GOLDEN_DIR,
) -> CertificationResult:
    """Run the certification on a started ``machine``; the certificate is always written.

    ``mode`` is ``CERTIFY`` (judge the gates), ``RECORD`` (record golden values) or ``PROBE``
    (the determinism probe). ``settings`` are the host's (timeouts, container, serving port and
    the file on the machine holding the server's API key, which every request then carries as a
    bearer token: vLLM ``--api-key``).
    """
    options = options or Options()
    settings = settings or environment.settings()
    api_key_file = settings.api_key_file
    result = CertificationResult(profile.name, target, ab_profile.name if ab_profile else None)
    result.options = {**asdict(options), "partial": bool(options.only), "mode": mode}
    start = time.monotonic()
    ctx: Context | None = None
    try:
        base = Configuration.of(profile)
        arm_b = Configuration.of(ab_profile) if ab_profile else None
        api_key = read_api_key(machine, api_key_file) if api_key_file else None
        with serving_endpoint(machine, settings.serving_port) as url:
            generator = LoadGenerator(url, api_key=api_key)
            key, model = _server_identity(generator, api_key_file)
            generator.model = model
            store = GoldenStore(profile.name, key, golden_dir)
            ctx = Context(
                machine, generator, switcher, base, result, options,
                golden=store if mode == CERTIFY else None, settings=settings, arm_b=arm_b,
                report_dir=report_dir, recorder=GoldenRecorder() if mode == RECORD else None,
            )  # fmt: skip
            _run(ctx, store)
            if result.status != RunStatus.REFUSED:
                result.status = RunStatus.FINISHED
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or the run's deadline (a KeyboardInterrupt)
        passed = isinstance(interrupt, deadline.DeadlineExceeded)
        result.status = RunStatus.INTERRUPTED
        result.error = str(interrupt) if passed else "interrupted (Ctrl-C)"
        _restore(ctx, result, "the deadline" if passed else "the interruption")
    except (DriverError, OSError, RuntimeError, ValueError) as error:
        result.status, result.error = RunStatus.ERROR, f"{type(error).__name__}: {error}"
        _restore(ctx, result, "the error")
    finally:
        result.wall_seconds = time.monotonic() - start
        result.left_on = ctx.current if ctx is not None else "unchanged (nothing was switched)"
        result.loadgen_overhead = overhead_summary(result.requests)
        paths = write_certificate(result, report_dir)
        log.info(f"certificate: {', '.join(str(p) for p in paths.values())}")
    return result


def _run(ctx: Context, store: GoldenStore) -> None:
    result = ctx.result
    preflight = _timed(ctx, "preflight", lambda: gates.preflight(ctx))
    result.started_on = ctx.current
    if preflight.status == ERROR:
        result.status = RunStatus.REFUSED
        result.error = "; ".join(preflight.problems[:3])
        return
    if result.mode == PROBE:
        _timed(ctx, "determinism", lambda: probe(ctx))
        return
    functions = _gate_functions(ctx)
    for name in ALL_GATES[1:]:
        if ctx.options.only and name not in ctx.options.only:
            continue
        if name == "ab" and ctx.arm_b is None and result.mode != RECORD:
            continue
        _timed(ctx, name, functions[name])
    if result.mode == RECORD:
        _timed(ctx, "record_golden", lambda: recording.write_golden(ctx, store))
    if ctx.touched and ctx.current != ctx.base.name:
        ctx.switch(ctx.base, reason="end on the starting configuration")
