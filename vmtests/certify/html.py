"""The HTML certificate with plots: latency CDFs per arm, the A/B ratios with their CIs against
the noise band, cold vs warm bars. Needs matplotlib (an optional extra: ``pip install
'vmtests[plots]'``); without it ``render`` returns None and only JSON and Markdown are written.
"""

from __future__ import annotations

import base64
import html
import importlib
import io
from typing import Any

from vmtests.certify.model import CertificationResult
from vmtests.certify.report import markdown


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _png(plt: Any, figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _latency_cdf(plt: Any, result: CertificationResult) -> str | None:
    groups: dict[str, list[float]] = {}
    for record in result.requests:
        if record.e2e is not None and record.stage in {"ab", "concurrency"}:
            arm = record.label.split("-")[-1][:1] if record.stage == "ab" else "conc"
            groups.setdefault(f"{record.stage} {arm}", []).append(record.e2e)
    if not groups:
        return None
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for name, values in sorted(groups.items()):
        ordered = sorted(values)
        axis.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    axis.set(xlabel="request latency (s)", ylabel="CDF", title="Latency CDF per arm")
    axis.legend()
    return _png(plt, figure)


def _ab_ratios(plt: Any, result: CertificationResult) -> str | None:
    gate = result.gate("ab")
    ratios = gate.numbers.get("ratios") if gate else None
    if not ratios or gate is None:
        return None
    band = float(gate.numbers.get("noise_band", 0.005))
    names = list(ratios)
    figure, axis = plt.subplots(figsize=(6, 3))
    for index, name in enumerate(names):
        item = ratios[name]
        axis.errorbar(
            item["ratio"], index, fmt="o",
            xerr=[[item["ratio"] - item["ci_low"]], [item["ci_high"] - item["ratio"]]],
        )  # fmt: skip
    axis.axvspan(1 - band, 1 + band, alpha=0.2, label=f"noise band +-{band:.1%}")
    axis.set_yticks(range(len(names)), names)
    axis.set(xlabel="B/A ratio (95 % bootstrap CI)", title="A/B")
    axis.legend()
    return _png(plt, figure)


def _cold_warm(plt: Any, result: CertificationResult) -> str | None:
    gate = result.gate("cold_warm")
    phases = gate.numbers.get("phases") if gate else None
    if not phases:
        return None
    sizes = list(phases.get("cold", {}))
    figure, axis = plt.subplots(figsize=(6, 3))
    width = 0.35
    for offset, phase in ((-width / 2, "cold"), (width / 2, "warm")):
        values = [phases[phase][size]["makespan"] for size in sizes]
        axis.bar([i + offset for i in range(len(sizes))], values, width, label=phase)
    axis.set_xticks(range(len(sizes)), sizes)
    axis.set(ylabel="makespan (s)", title="Cold vs warm (separate phases)")
    axis.legend()
    return _png(plt, figure)


def render(result: CertificationResult) -> str | None:
    """The HTML page, or None when matplotlib is not installed."""
    plt = _pyplot()
    if plt is None:
        return None
    images = [
        image
        for image in (_latency_cdf(plt, result), _ab_ratios(plt, result), _cold_warm(plt, result))
        if image
    ]
    body = "".join(f'<img src="data:image/png;base64,{image}">' for image in images)
    return (
        "<!doctype html><meta charset=utf-8><title>vmtests certificate</title>"
        f"<h1>{html.escape(result.verdict)}</h1>{body}"
        f"<pre>{html.escape(markdown(result))}</pre>"
    )
