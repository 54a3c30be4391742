"""``python3 -m vmtests.stub.server <vLLM args>``: the stub vLLM OpenAI-compatible server.

It prints the startup lines of the real stack (vLLM 0.16's log prefix and lines, see
``release.py``; one banner per qwen36 feature), refuses to start where the real stack refuses
(``startup.py``, and the tool-parser checks below), then serves the
OpenAI endpoints on ``--host``/``--port`` (behind an API key when ``--api-key`` or
``$VLLM_API_KEY`` gives one, as vLLM does) until SIGTERM or SIGINT, when it drains the requests in
flight (at most ``VMTESTS_STUB_DRAIN_TIMEOUT`` s), logs the shutdown lines and exits 0.

Exit status: 0 after a clean shutdown, 1 when startup is refused or fails or the engine dies
while serving (``VMTESTS_STUB_CRASH_AFTER``), 2 for invalid arguments or knobs. Standard library
only.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType

from vmtests.contracts.serving import API_KEY_VARIABLE
from vmtests.stub import faults, knobs, latency, release, startup
from vmtests.stub.args import ServeArgs, parse_args
from vmtests.stub.engine import Engine
from vmtests.stub.engine_config import cache_config, engine_config_line
from vmtests.stub.http_handler import GET_ROUTES, ServingApp, StubHTTPServer, api_key_hashes
from vmtests.stub.prefix_cache import PrefixCache
from vmtests.stub.vllm_log import ENGINE_CORE, VllmLog

ENGINE_INIT_FAILURE = (
    "Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore_DP0': 1}"
)
POST_ROUTES = ("/v1/completions", "/v1/chat/completions")


def _build_engine(
    args: ServeArgs, plan: startup.Plan, env: knobs.Environ, fault_knobs: faults.Faults
) -> Engine:
    cache = PrefixCache(args.effective_block_size) if plan.active.prefix_caching else None
    return Engine(
        model_name=args.model_name,
        max_num_seqs=args.effective_max_num_seqs,
        max_model_len=args.effective_max_model_len,
        latency=latency.build(plan.active, plan.async_scheduling, env),
        faults=fault_knobs,
        prefix_cache=cache,
        cache_config=cache_config(args, plan),
    )


def _load(
    args: ServeArgs, env: knobs.Environ, printer: VllmLog, fault_knobs: faults.Faults
) -> tuple[Engine, startup.Plan]:
    """Everything between the argument dump and the HTTP bind; raises ``StartupRefused``."""
    for number in range(1, fault_knobs.log_flood + 1):
        # A chatty device start-up (tt-metal logs per core and per kernel on a real card).
        printer.info(
            "device",
            f"vmtests stub log flood {number}/{fault_knobs.log_flood} ({knobs.LOG_FLOOD})",
            role=ENGINE_CORE,
        )
    plan = startup.decide(args, env, printer)
    engine = _build_engine(args, plan, env, fault_knobs)
    printer.info("engine", engine_config_line(args, plan), role=ENGINE_CORE)
    if fault_knobs.active():
        printer.warning(
            "engine", f"vmtests stub fault knobs: {fault_knobs.active()}", role=ENGINE_CORE
        )
    if fault_knobs.start_delay:
        time.sleep(fault_knobs.start_delay)  # a slow model load
    if fault_knobs.hang == "start":
        # Never returns. SIGTERM's default action ends it, except as a container's PID 1, which
        # ignores it: `docker stop` then waits out its timeout and kills it.
        threading.Event().wait()
    startup.load_model(plan, env, printer)
    if fault_knobs.crash_at_start:
        raise startup.StartupRefused(
            "engine", f"{ENGINE_INIT_FAILURE} (injected by {knobs.CRASH_AT_START})"
        )
    step_ms = latency.DECODE_STEP_MS * engine.latency.decode_factor
    printer.info(
        "engine",
        f"vmtests stub latency model: decode step {step_ms:.2f} ms x scale "
        f"{engine.latency.scale}, factors {engine.latency.factors}",
        role=ENGINE_CORE,
    )
    if plan.active.tool_calling:
        printer.info("tool", release.TOOL_CHOICE_LINE)
    return engine, plan


def _serve(
    server: StubHTTPServer, app: ServingApp, drain_timeout: float, crash_after: float = 0.0
) -> int:
    """Serve until SIGTERM/SIGINT, then drain and close (0); with ``crash_after``, once that
    many seconds passed, the engine dies: its fatal error, the server's end, 1."""
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        """Only record the signal: shutdown work runs in the main loop, not in the handler."""
        received.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    printer = app.printer
    printer.uvicorn(f"Started server process [{printer.pid}]")
    printer.uvicorn("Waiting for application startup.")
    printer.uvicorn("Application startup complete.")
    deadline = time.monotonic() + crash_after if crash_after else None
    while not stop.wait(1.0):
        if deadline is not None and time.monotonic() >= deadline:
            injected = f"(injected by {knobs.CRASH_AFTER} after {crash_after:g} s of serving)"
            printer.error("engine", f"{release.ENGINE_FATAL} {injected}", role=ENGINE_CORE)
            printer.error("shutdown", release.SERVER_TERMINATING)
            server.shutdown()
            server.server_close()
            thread.join(timeout=5.0)
            printer.uvicorn(f"Finished server process [{printer.pid}]")
            return 1
    printer.info(
        "shutdown",
        f"Received {received[0]}; shutting down gracefully, draining "
        f"{app.engine.in_flight} in-flight request(s)",
    )
    printer.uvicorn("Shutting down")
    left = app.engine.drain(drain_timeout)
    if left:
        printer.warning(
            "shutdown", f"Aborted {left} request(s) still running after {drain_timeout}s"
        )
    server.shutdown()
    server.server_close()
    thread.join(timeout=5.0)
    printer.uvicorn("Waiting for application shutdown.")
    printer.uvicorn("Application shutdown complete.")
    printer.uvicorn(f"Finished server process [{printer.pid}]")
    return 0


def _traceback(kind: str, message: str) -> int:
    """An uncaught exception of ``vllm serve`` before the engine starts: traceback, exit 1."""
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "/usr/local/bin/vllm", line 10, in <module>', file=sys.stderr)
    print(f"{kind}: {message}", file=sys.stderr, flush=True)
    return 1


def _log_version(args: ServeArgs, env: knobs.Environ, printer: VllmLog) -> None:
    """``log_version_and_model``: the logo, or the plain line without vLLM's own formatter."""
    if env.get(release.LOGO_DISABLE_VARIABLE, "").strip() not in {"", "0"}:
        printer.info("version", release.version_line(release.VLLM_VERSION, args.model_path))
        return
    lines = release.logo_lines(release.VLLM_VERSION, args.model_path)
    printer.info("version", "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """Run the stub server; returns the process exit status."""
    args, parser = parse_args(sys.argv[1:] if argv is None else argv)
    env = knobs.current_environment()
    printer = VllmLog()
    if args.model is not None:
        printer.warning("model_option", release.MODEL_OPTION_WARNING, role=None)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        # entrypoints/openai/cli_args.py validate_parsed_serve_args, before any server log.
        return _traceback("TypeError", release.AUTO_TOOL_WITHOUT_PARSER)
    try:
        fault_knobs = faults.from_environment(env)
        drain_timeout = knobs.env_float(env, knobs.DRAIN_TIMEOUT, knobs.DEFAULT_DRAIN_TIMEOUT)
        knobs.env_float(env, knobs.TIME_SCALE, knobs.DEFAULT_TIME_SCALE)
        knobs.env_step_factors(env)
        knobs.model_capabilities(env)
    except knobs.KnobError as error:
        print(f"vmtests.stub.server: error: {error}", file=sys.stderr, flush=True)
        return 2
    _log_version(args, env, printer)
    printer.info("args", f"non-default args: {args.non_default(parser)}")
    parser_name = args.tool_call_parser
    if args.enable_auto_tool_choice and parser_name not in release.TOOL_CALL_PARSERS:
        # entrypoints/openai/api_server.py validate_api_server_args raises KeyError.
        return _traceback("KeyError", repr(release.unknown_tool_parser(str(parser_name))))
    try:
        engine, plan = _load(args, env, printer, fault_knobs)
    except startup.StartupRefused as refusal:
        printer.error(refusal.source, refusal.message)
        return 1
    host = args.host or "0.0.0.0"
    # --api-key wins over $VLLM_API_KEY (vLLM 0.16 entrypoints/openai/api_server.py).
    keys = args.api_key or [env.get(API_KEY_VARIABLE, "")]
    app = ServingApp(
        engine=engine,
        args=args,
        active=plan.active,
        printer=printer,
        api_key_hashes=api_key_hashes(keys),
    )
    try:
        server = StubHTTPServer((host, args.port), app)
    except OSError as error:
        printer.error("start", f"Failed to bind {host}:{args.port}: {error}")
        return 1
    printer.info("start", f"Starting vLLM API server 0 on http://{host}:{args.port}")
    printer.info("routes", "Available routes are:")
    for route in GET_ROUTES:
        printer.info("routes", f"Route: {route}, Methods: GET")
    for route in POST_ROUTES:
        printer.info("routes", f"Route: {route}, Methods: POST")
    return _serve(server, app, drain_timeout, fault_knobs.crash_after)


if __name__ == "__main__":
    sys.exit(main())
