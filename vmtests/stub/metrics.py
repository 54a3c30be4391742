"""vLLM's Prometheus metrics, kept by the stub engine and rendered as Prometheus text.

Names, types, help texts, labels and buckets follow vLLM ``v1/metrics/loggers.py``
(``PrometheusStatLogger``): labels are ``labelnames = ["model_name", "engine"]`` (plus
``finished_reason`` for ``vllm:request_success``), one ``request_success`` series per finish
reason of ``v1/engine/__init__.py``, and ``vllm:cache_config_info`` (an info gauge whose labels
are the cache config, then ``engine``). The text is what prometheus_client's
``exposition.generate_latest`` writes for a single API server (default registry): every label
set sorted by label name (``sample_line`` sorts, so ``le`` sits between ``engine`` and
``model_name``), counters as ``_total``, a ``_created`` gauge family after every counter and
histogram, values formatted by ``utils.floatToGoString``.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass, field

from vmtests.stub.release import FINISH_REASONS

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                       5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

COUNTERS = {
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
}
SUCCESS = "vllm:request_success"
GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.",
                                         TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.",
                                         INTER_TOKEN_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.",
                                         E2E_BUCKETS),
}  # fmt: skip
CACHE_CONFIG_INFO = "vllm:cache_config_info"
CACHE_CONFIG_HELP = "Information of the LLMEngine CacheConfig"


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is >= it (``le`` semantics)."""
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.buckets):
            self.counts[index] += 1
        self.total += value
        self.count += 1


def _number(value: float) -> str:
    """prometheus_client ``utils.floatToGoString``: Go's float format (``1.7e+09``)."""
    number = float(value)
    if number in {float("inf"), float("-inf")}:
        return "+Inf" if number > 0 else "-Inf"
    if math.isnan(number):
        return "NaN"
    text = repr(number)
    dot = text.find(".")
    if number > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


class Metrics:
    """The engine's metrics; every method is thread-safe."""

    def __init__(
        self, model_name: str, engine: str = "0", cache_config: dict[str, str] | None = None
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.labels = _labels(model_name=model_name, engine=engine)
        self.cache_config = dict(cache_config or {})
        self._created = time.time()
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(COUNTERS, 0.0)
        self._success = dict.fromkeys(FINISH_REASONS, 0.0)
        self._gauges = dict.fromkeys(GAUGES, 0.0)
        self._histograms = {name: _Histogram(spec[1]) for name, spec in HISTOGRAMS.items()}

    def add(self, counter: str, amount: float) -> None:
        """Increase ``counter`` (a ``COUNTERS`` name) by ``amount``."""
        with self._lock:
            self._counters[counter] += amount

    def success(self, finished_reason: str) -> None:
        """Count one successfully finished request."""
        with self._lock:
            self._success[finished_reason] += 1

    def set_gauge(self, gauge: str, value: float) -> None:
        """Set ``gauge`` (a ``GAUGES`` name)."""
        with self._lock:
            self._gauges[gauge] = value

    def observe(self, histogram: str, value: float) -> None:
        """Record ``value`` in ``histogram`` (a ``HISTOGRAMS`` name)."""
        with self._lock:
            self._histograms[histogram].observe(value)

    def value(self, counter: str) -> float:
        """The current value of a counter (for logs and tests)."""
        with self._lock:
            return self._counters[counter]

    def render(self) -> str:
        """The metrics in the Prometheus text exposition format (version 0.0.4)."""
        out: list[str] = []
        created = _number(self._created)
        with self._lock:
            if self.cache_config:
                self._header(out, CACHE_CONFIG_INFO, CACHE_CONFIG_HELP, "gauge")
                labels = _labels(**self.cache_config, engine=self.engine)
                out.append(f"{CACHE_CONFIG_INFO}{{{labels}}} 1.0")
            for name, text in COUNTERS.items():
                self._header(out, f"{name}_total", text, "counter")
                out.append(f"{name}_total{{{self.labels}}} {_number(self._counters[name])}")
                self._header(out, f"{name}_created", text, "gauge")
                out.append(f"{name}_created{{{self.labels}}} {created}")
            success_help = "Count of successfully processed requests."
            self._header(out, f"{SUCCESS}_total", success_help, "counter")
            for reason, count in self._success.items():
                labels = self._with(finished_reason=reason)
                out.append(f"{SUCCESS}_total{{{labels}}} {_number(count)}")
            self._header(out, f"{SUCCESS}_created", success_help, "gauge")
            for reason in self._success:
                labels = self._with(finished_reason=reason)
                out.append(f"{SUCCESS}_created{{{labels}}} {created}")
            for name, text in GAUGES.items():
                self._header(out, name, text, "gauge")
                out.append(f"{name}{{{self.labels}}} {_number(self._gauges[name])}")
            for name, (text, _) in HISTOGRAMS.items():
                self._header(out, name, text, "histogram")
                self._render_histogram(out, name, self._histograms[name])
                self._header(out, f"{name}_created", text, "gauge")
                out.append(f"{name}_created{{{self.labels}}} {created}")
        return "\n".join(out) + "\n"

    def _render_histogram(self, out: list[str], name: str, histogram: _Histogram) -> None:
        cumulative = 0
        for bound, count in zip(histogram.buckets, histogram.counts, strict=True):
            cumulative += count
            labels = self._with(le=_number(bound))
            out.append(f"{name}_bucket{{{labels}}} {_number(cumulative)}")
        labels = self._with(le="+Inf")
        out.append(f"{name}_bucket{{{labels}}} {_number(histogram.count)}")
        out.append(f"{name}_count{{{self.labels}}} {_number(histogram.count)}")
        out.append(f"{name}_sum{{{self.labels}}} {_number(histogram.total)}")

    def _with(self, **extra: str) -> str:
        """This engine's labels plus ``extra``, in prometheus_client's order."""
        return _labels(model_name=self.model_name, engine=self.engine, **extra)

    @staticmethod
    def _header(out: list[str], name: str, text: str, kind: str) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")


def _labels(**values: str) -> str:
    """A label set as prometheus_client writes it: sorted by name, values escaped."""
    return ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(values.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
