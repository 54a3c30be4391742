"""A streaming load generator for the OpenAI chat endpoint: standard library, one thread per slot.

Every request is a streamed ``/v1/chat/completions`` call (SSE). Per request it records:

- ``ttft``: from just before the request is sent to the first SSE chunk that carries content.
  The role-only first chunk of a chat stream (``{"role": "assistant", "content": ""}``) does
  not count: vLLM's own TTFT counts it, AIPerf and llmperf do not, and neither do we;
- ``e2e``, the number of content chunks and the mean decode step (time between the first and
  the last content chunk divided by the steps between them);
- HTTP status, error text, the output text and its sha256, the prompt tokens from ``usage``;
- ``client_cpu``: CPU seconds the generator's thread spent on this request (sending,
  reading and parsing), so the report can show that the generator is not the bottleneck.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

DEFAULT_REQUEST_TIMEOUT = 600.0
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: which prompt, how many tokens, sampling."""

    prompt_id: str
    prompt: str
    max_tokens: int
    seed: int = 0
    temperature: float = 0.0

    def body(self, model: str | None) -> dict[str, Any]:
        """The JSON body of the streamed chat completion."""
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if model:
            body["model"] = model
        return body


TIMEOUT, CONNECTION, STREAM_ERROR = "timeout", "error", "stream-error"
"""Why a request got no complete answer (``RequestRecord.error_kind``), besides an HTTP status."""
DEGENERATE, WRONG_OUTPUT, UNREPRODUCIBLE = "degenerate", "wrong-output", "unreproducible"
"""What is wrong with an answer (``RequestRecord.finding_kinds``)."""


@dataclass
class RequestRecord:
    """The outcome of one request (times in seconds; ``start`` relative to the run's start).

    ``error`` and ``findings`` are for people; ``error_kind`` and ``finding_kinds`` say the
    same as keys (``TIMEOUT``, ``DEGENERATE``, ...).
    """

    stage: str
    label: str
    prompt_id: str
    index: int
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    status: int | None = None
    error: str = ""
    error_kind: str = ""
    output_sha: str = ""
    text: str = ""
    chunks: int = 0
    decode_step: float | None = None
    prompt_tokens: int | None = None
    client_cpu: float = 0.0
    findings: list[str] = field(default_factory=list)
    finding_kinds: list[str] = field(default_factory=list)
    condition: str = ""
    """The golden condition it was sent under (``b32-warm``: see ``vmtests.certify.golden``)."""

    def add_finding(self, kind: str, text: str) -> None:
        """Note what is wrong with the answer: ``kind`` (``DEGENERATE``, ``WRONG_OUTPUT``,
        ``UNREPRODUCIBLE``) and ``text`` for people."""
        self.finding_kinds.append(kind)
        self.findings.append(text)

    @property
    def ok(self) -> bool:
        """True when the request completed with HTTP 200, no error and no finding."""
        return self.status == 200 and not self.error and not self.findings and bool(self.text)

    def to_dict(self, with_text: bool = False) -> dict[str, Any]:
        """JSON form; the text itself only on request (shas identify outputs)."""
        data = asdict(self)
        if not with_text:
            data.pop("text")
        return data


def sha256_text(text: str) -> str:
    """The sha256 of an output text (UTF-8), as hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _content(event: dict[str, Any]) -> str:
    pieces = []
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        piece = delta.get("content") if "delta" in choice else choice.get("text")
        if piece:
            pieces.append(str(piece))
    return "".join(pieces)


class LoadGenerator:
    """Sends streamed chat requests to ``base_url``; thread-safe."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        api_key: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the serving endpoint must be http://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.model = model
        self.timeout = timeout
        self.origin = time.perf_counter()
        # vLLM's --api-key wants ``Authorization: Bearer <key>`` on every /v1 request.
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def get(self, path: str) -> tuple[int, str]:
        """A plain GET (``/metrics``, ``/version``, ``/v1/models``): status and body."""
        connection = self._connection()
        try:
            connection.request("GET", path, headers=self._auth)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", errors="replace")
        finally:
            connection.close()

    def send(self, spec: RequestSpec, stage: str, label: str, index: int) -> RequestRecord:
        """Send one streamed request and record what happened (never raises for the server)."""
        record = RequestRecord(stage, label, spec.prompt_id, index)
        cpu_start = time.thread_time()
        payload = json.dumps(spec.body(self.model)).encode()
        connection = self._connection()
        sent = time.perf_counter()
        record.start = sent - self.origin
        pieces: list[str] = []
        first = last = None
        try:
            headers = {"Content-Type": "application/json", **self._auth}
            connection.request("POST", CHAT_PATH, body=payload, headers=headers)
            response = connection.getresponse()
            record.status = response.status
            if response.status != 200:
                record.error = f"HTTP {response.status}: {response.read()[:300]!r}"
                record.error_kind = f"http-{response.status}"
            else:
                for raw in response:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        record.error = f"stream error: {event['error']}"
                        record.error_kind = STREAM_ERROR
                        continue
                    if event.get("usage"):
                        record.prompt_tokens = event["usage"].get("prompt_tokens")
                    piece = _content(event)
                    if piece:
                        now = time.perf_counter()
                        first = first if first is not None else now
                        last = now
                        pieces.append(piece)
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
            record.error = f"{type(error).__name__}: {error}"
            record.error_kind = TIMEOUT if isinstance(error, TimeoutError) else CONNECTION
        finally:
            connection.close()
        done = time.perf_counter()
        record.e2e = done - sent
        record.text = "".join(pieces)
        record.output_sha = sha256_text(record.text) if pieces else ""
        record.chunks = len(pieces)
        if first is not None:
            record.ttft = first - sent
            if last is not None and len(pieces) > 1:
                record.decode_step = (last - first) / (len(pieces) - 1)
        record.client_cpu = time.thread_time() - cpu_start
        return record


@dataclass
class BatchResult:
    """The records of one batch and its makespan (first send to last completion)."""

    records: list[RequestRecord]
    makespan: float


def run_batch(
    generator: LoadGenerator,
    specs: Sequence[RequestSpec],
    *,
    concurrency: int,
    stage: str,
    label: str,
    first_index: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> BatchResult:
    """Send ``specs`` with at most ``concurrency`` in flight (a closed loop of workers)."""
    lock = threading.Lock()
    records: list[RequestRecord] = []

    def one(position: int) -> None:
        record = generator.send(specs[position], stage, label, first_index + position)
        with lock:
            records.append(record)
        if on_record is not None:
            on_record(record)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="loadgen") as pool:
        list(pool.map(one, range(len(specs))))
    makespan = time.perf_counter() - start
    records.sort(key=lambda record: record.index)
    return BatchResult(records, makespan)


def overhead_summary(records: Sequence[RequestRecord]) -> dict[str, float]:
    """The generator's own cost: client CPU per request and its share of the request time."""
    timed = [r for r in records if r.e2e]
    if not timed:
        return {"requests": 0.0}
    cpu = [r.client_cpu for r in timed]
    return {
        "requests": float(len(timed)),
        "client_cpu_mean_ms": 1000 * sum(cpu) / len(cpu),
        "client_cpu_max_ms": 1000 * max(cpu),
        "client_cpu_share_of_e2e": sum(cpu) / sum(r.e2e or 0.0 for r in timed),
    }
