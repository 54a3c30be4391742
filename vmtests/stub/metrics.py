"""vLLM's Prometheus metrics, kept by the stub engine and rendered as Prometheus text.

Names, types and labels follow vLLM (``vllm/v1/metrics/loggers.py``): every sample carries
``model_name`` and ``engine``; counters are exposed with ``_total`` as prometheus_client does;
histogram buckets are vLLM's.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

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
FINISHED_REASONS = ("stop", "length", "abort")


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
    return repr(float(value))


class Metrics:
    """The engine's metrics; every method is thread-safe."""

    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.labels = f'engine="{engine}",model_name="{_escape(model_name)}"'
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(COUNTERS, 0.0)
        self._success = dict.fromkeys(FINISHED_REASONS, 0.0)
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
        with self._lock:
            for name, text in COUNTERS.items():
                self._header(out, f"{name}_total", text, "counter")
                out.append(f"{name}_total{{{self.labels}}} {_number(self._counters[name])}")
            self._header(out, f"{SUCCESS}_total", "Count of successfully processed requests.",
                         "counter")  # fmt: skip
            for reason, count in self._success.items():
                labels = f'{self.labels},finished_reason="{reason}"'
                out.append(f"{SUCCESS}_total{{{labels}}} {_number(count)}")
            for name, text in GAUGES.items():
                self._header(out, name, text, "gauge")
                out.append(f"{name}{{{self.labels}}} {_number(self._gauges[name])}")
            for name, (text, _) in HISTOGRAMS.items():
                self._header(out, name, text, "histogram")
                self._render_histogram(out, name, self._histograms[name])
        return "\n".join(out) + "\n"

    def _render_histogram(self, out: list[str], name: str, histogram: _Histogram) -> None:
        cumulative = 0
        for bound, count in zip(histogram.buckets, histogram.counts, strict=True):
            cumulative += count
            out.append(f'{name}_bucket{{{self.labels},le="{bound}"}} {_number(cumulative)}')
        out.append(f'{name}_bucket{{{self.labels},le="+Inf"}} {_number(histogram.count)}')
        out.append(f"{name}_count{{{self.labels}}} {_number(histogram.count)}")
        out.append(f"{name}_sum{{{self.labels}}} {_number(histogram.total)}")

    @staticmethod
    def _header(out: list[str], name: str, text: str, kind: str) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
