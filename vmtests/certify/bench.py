"""``python3 -m vmtests.certify.bench``: the load generator's own overhead, against the stub at
zero latency (``VMTESTS_STUB_TIME_SCALE=0``), so that the figures are the generator's and the
HTTP stack's, not a model's. Prints figures; asserts nothing (the suite's rule for benchmarks).

The generator must not be the bottleneck of a gate: compare its requests per second here with
the rate a gate needs (256 requests in a few minutes on a P150) and its client CPU per request
with the request times the certificate reports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vmtests.certify import prompts
from vmtests.certify.context import spec
from vmtests.certify.loadgen import LoadGenerator, overhead_summary, run_batch
from vmtests.guest.local_stub import LocalStubServer
from vmtests.stub import knobs

STUB_ARGS = ("--model", "/models/qwen36", "--served-model-name", "qwen36")


def measure(requests: int, concurrency: int, tokens: int) -> dict[str, float]:
    """Send ``requests`` streamed requests at ``concurrency`` to a zero-latency local stub."""
    environment = {knobs.DEVICES: "/dev/null", knobs.TIME_SCALE: "0"}
    server = LocalStubServer(STUB_ARGS, environment).start().wait_ready(30.0)
    try:
        generator = LoadGenerator(server.url, model="qwen36", timeout=60)
        pool = prompts.concurrency_prompts()
        specs = [spec(pool[i % len(pool)], tokens) for i in range(requests)]
        batch = run_batch(generator, specs, concurrency=concurrency, stage="bench", label="bench")
    finally:
        server.kill()
    figures = overhead_summary(batch.records)
    figures.update(
        failed=float(sum(not record.ok for record in batch.records)),
        makespan_s=batch.makespan,
        requests_per_s=len(batch.records) / batch.makespan,
        chunks_per_s=sum(record.chunks for record in batch.records) / batch.makespan,
    )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Print the load generator's figures."""
    parser = argparse.ArgumentParser(prog="python3 -m vmtests.certify.bench")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args(argv)
    figures = measure(args.requests, args.concurrency, args.tokens)
    print(f"load generator vs stub at zero latency: {args.requests} requests, "
          f"concurrency {args.concurrency}, {args.tokens} tokens each")  # fmt: skip
    for name, value in figures.items():
        print(f"  {name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
