"""The stub engine: admission under ``--max-num-seqs``, prefix caching, timing, metrics, drain.

A request runs in its HTTP handler thread. It waits for one of ``max_num_seqs`` slots (counted
by the waiting gauge), looks its prompt up in the prefix cache, sleeps its modelled prefill,
then yields one token per modelled decode step. Shutdown stops admission and waits for the
requests in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from vmtests.stub.faults import Faults
from vmtests.stub.latency import LatencyModel
from vmtests.stub.metrics import Metrics
from vmtests.stub.prefix_cache import PrefixCache


class RequestError(Exception):
    """A request the engine refuses or fails; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class EngineRequest:
    """What the engine needs to run one request; ``pieces`` are the tokens it will emit."""

    prompt_ids: list[int]
    pieces: list[str]


@dataclass
class RequestStats:
    """Per-request figures the API layer reports (prefix hits) after the run."""

    cached_tokens: int = 0
    finished_reason: str = "length"


class Engine:
    """Schedules requests; thread-safe."""

    def __init__(
        self,
        *,
        model_name: str,
        max_num_seqs: int,
        max_model_len: int,
        latency: LatencyModel,
        faults: Faults,
        prefix_cache: PrefixCache | None,
        cache_config: dict[str, str] | None = None,
    ) -> None:
        self.model_name = model_name
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.latency = latency
        self.faults = faults
        self.prefix_cache = prefix_cache
        self.metrics = Metrics(model_name, cache_config=cache_config)
        self._slots = threading.BoundedSemaphore(max_num_seqs)
        self._state = threading.Condition()
        self._waiting = 0
        self._running = 0
        self._in_flight = 0
        self._draining = False
        self._aborted = threading.Event()

    # ---- admission and bookkeeping ---------------------------------------------------------

    def _update_gauges(self) -> None:
        self.metrics.set_gauge("vllm:num_requests_waiting", self._waiting)
        self.metrics.set_gauge("vllm:num_requests_running", self._running)
        self.metrics.set_gauge("vllm:kv_cache_usage_perc", self._running / self.max_num_seqs)

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished (waiting or running)."""
        with self._state:
            return self._in_flight

    @property
    def draining(self) -> bool:
        """True once shutdown began: new requests are refused."""
        with self._state:
            return self._draining

    @contextmanager
    def admission(self) -> Iterator[None]:
        """Count one HTTP request as in flight until its response is written.

        Raises ``RequestError`` (503) once draining began. Shutdown waits for these scopes, not
        for the token iterators, so the last bytes (``data: [DONE]``) still reach the client.
        """
        with self._state:
            if self._draining:
                raise RequestError(503, "ServiceUnavailableError", "server is shutting down")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._state:
                self._in_flight -= 1
                self._state.notify_all()

    def check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        """Refuse a request longer than ``--max-model-len`` with vLLM's 400 message."""
        if prompt_tokens + max_tokens > self.max_model_len:
            raise RequestError(
                400,
                "BadRequestError",
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {max_tokens} in the completion). Please reduce the length of the "
                "messages or completion.",
            )

    def run(self, request: EngineRequest, stats: RequestStats) -> Generator[str, None, None]:
        """Run ``request``: yield each generated piece at its modelled time.

        Raises ``RequestError`` when the fault knob fails the request or shutdown aborts it.
        Closing the iterator early (client gone) releases the slot.
        """
        arrival = time.monotonic()
        with self._state:
            self._waiting += 1
            self._update_gauges()
        admitted = False
        try:
            self._slots.acquire()
            admitted = True
            with self._state:
                self._waiting -= 1
                self._running += 1
                self._update_gauges()
            yield from self._execute(request, stats, arrival)
        finally:
            with self._state:
                if admitted:
                    self._running -= 1
                    self._slots.release()
                else:
                    self._waiting -= 1
                self._update_gauges()

    def _execute(
        self, request: EngineRequest, stats: RequestStats, arrival: float
    ) -> Iterator[str]:
        if self.faults.draw_failure():
            raise RequestError(500, "InternalServerError", "EngineCore encountered an issue")
        uncached, cached = len(request.prompt_ids), 0
        if self.prefix_cache is not None:
            lookup = self.prefix_cache.lookup_and_insert(request.prompt_ids)
            cached, uncached = lookup.hit, lookup.queried - lookup.hit
            self.metrics.add("vllm:prefix_cache_queries", lookup.queried)
            self.metrics.add("vllm:prefix_cache_hits", lookup.hit)
        stats.cached_tokens = cached
        self.metrics.add("vllm:prompt_tokens", len(request.prompt_ids))
        self._sleep(self.latency.prefill_seconds(uncached, cached))
        if self.faults.hang == "request":
            self._aborted.wait()
            raise RequestError(500, "InternalServerError", "request aborted: engine hung")
        self.metrics.observe("vllm:time_to_first_token_seconds", time.monotonic() - arrival)
        for index, piece in enumerate(request.pieces):
            if index:
                # The device's step: vLLM times inter-token latency from engine-core output
                # timestamps (vllm v1/metrics/stats.py, IterationStats), so neither the time
                # the API server spends streaming the previous token (this generator waits at
                # the ``yield``) nor the stand-in's own late wake-ups on a loaded emulator are
                # in it: the modelled step of the card is.
                step = self.latency.step_seconds(self._running)
                self._sleep(step)
                self.metrics.observe("vllm:inter_token_latency_seconds", step)
            self.metrics.add("vllm:generation_tokens", 1)
            yield piece
        self.metrics.success(stats.finished_reason)
        self.metrics.observe("vllm:e2e_request_latency_seconds", time.monotonic() - arrival)

    def _sleep(self, seconds: float) -> None:
        # Waiting on the abort event instead of time.sleep lets a forced stop end requests.
        if seconds > 0 and self._aborted.wait(seconds):
            raise RequestError(500, "InternalServerError", "request aborted at shutdown")

    # ---- shutdown --------------------------------------------------------------------------

    def drain(self, timeout: float) -> int:
        """Refuse new requests and wait up to ``timeout`` s for in-flight ones.

        Returns how many requests were still in flight at the deadline; those are aborted.
        """
        deadline = time.monotonic() + timeout
        with self._state:
            self._draining = True
            while self._in_flight and time.monotonic() < deadline:
                self._state.wait(max(0.0, deadline - time.monotonic()))
            left = self._in_flight
        if left:
            self._aborted.set()
        return left
