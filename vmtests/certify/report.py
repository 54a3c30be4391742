"""The certificate: ``certificate.json`` (everything), ``certificate.md`` (verdict first, then a
gate table, the persistence reports' version table) and, when matplotlib is installed,
``certificate.html`` with plots (``html.py``; it embeds the Markdown).

Files are written atomically with the persistence reports' ``write_atomic``; free text is
redacted on the way out (``vmtests.scenario.collection.redact``). The Markdown never needs
matplotlib.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vmtests.certify.model import (
    DEGENERATE_DETECTOR,
    GOLDEN_DETECTOR,
    PROBE,
    RECORD,
    CertificationResult,
)
from vmtests.report import version_lines, write_atomic
from vmtests.scenario.collection.redact import redact_text

JSON_NAME, MARKDOWN_NAME, HTML_NAME = "certificate.json", "certificate.md", "certificate.html"


def certificate_data(result: CertificationResult) -> dict[str, Any]:
    """The JSON document: verdict, gates with their numbers, every request and every switch."""
    data = {
        "verdict": result.verdict,
        "exit_status": result.exit_status,
        "status": result.status,
        "error": result.error,
        "profile": result.profile,
        "ab": result.ab,
        "target": result.target,
        "started_on": result.started_on,
        "left_on": result.left_on,
        "wall_seconds": round(result.wall_seconds, 3),
        "options": result.options,
        "identity": result.identity,
        "version_table": result.versions.to_dict(),
        "loadgen_overhead": result.loadgen_overhead,
        "detectors": {name: counts.to_dict() for name, counts in result.detectors.items()},
        "unanswered": result.unanswered,
        "gates": [gate.to_dict() for gate in result.gates],
        "switches": [switch.to_dict() for switch in result.switches],
        "requests": [record.to_dict() for record in result.requests],
    }
    return json.loads(redact_text(json.dumps(data, default=str)))  # type: ignore[no-any-return]


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _key_numbers(numbers: dict[str, Any]) -> str:
    simple = [
        f"{key}={_number(value)}"
        for key, value in numbers.items()
        if isinstance(value, int | float | str) and key not in {"decision_text"}
    ]
    return ", ".join(simple)[:400]


def markdown(result: CertificationResult) -> str:
    """The Markdown certificate: verdict first, then the gate table and the details."""
    lines = [
        f"# {result.verdict}",
        "",
        f"- profile: `{result.profile}`" + (f", A/B against `{result.ab}`" if result.ab else ""),
        f"- target: `{result.target}`; run status: {result.status}"
        + (f" ({result.error})" if result.error else ""),
        f"- the host started on `{result.started_on}` and was left on `{result.left_on}`",
        f"- exit status {result.exit_status}; wall time {result.wall_seconds:.1f} s; "
        f"{len(result.requests)} requests, {len(result.switches)} switches",
        "",
        "| gate | status | summary | numbers |",
        "| --- | --- | --- | --- |",
    ]
    for gate in result.gates:
        summary = gate.summary.replace("|", "\\|")
        numbers = _key_numbers(gate.numbers).replace("|", "\\|")
        lines.append(f"| {gate.name} | **{gate.status}** | {summary} | {numbers} |")
    lines += ["", *version_lines(result.versions), "", *detector_lines(result)]
    probe = result.gate("determinism")
    if probe is not None:
        lines += ["", *probe_lines(probe.numbers)]
    for gate in result.gates:
        if gate.problems:
            lines += ["", f"## {gate.name}: problems", ""]
            lines += [f"- {problem}" for problem in gate.problems[:40]]
    identity = result.identity
    if identity:
        lines += [
            "",
            "## Host identity",
            "",
            f"- hostname `{identity.get('hostname')}`, kernel `{identity.get('kernel')}`",
            f"- driver `{identity.get('driver')}`, tt-smi `{identity.get('tt_smi')}`",
            f"- boards: {identity.get('boards')}",
            f"- booted system `{identity.get('booted_system')}`",
            f"- module config digest `{identity.get('config_digest')}`",
        ]
    if result.loadgen_overhead:
        overhead = result.loadgen_overhead
        lines += [
            "",
            "## Load generator overhead",
            "",
            f"- client CPU per request: mean {overhead.get('client_cpu_mean_ms', 0):.2f} ms, "
            f"max {overhead.get('client_cpu_max_ms', 0):.2f} ms; "
            f"{overhead.get('client_cpu_share_of_e2e', 0):.2%} of the request time",
        ]
    return redact_text("\n".join(lines) + "\n")


def detector_lines(result: CertificationResult) -> list[str]:
    """How many responses each detector judged and flagged, stated even when none was."""
    degenerate = result.detectors[DEGENERATE_DETECTOR]
    golden = result.detectors[GOLDEN_DETECTOR]
    lines = [
        "## Detectors",
        "",
        f"- degenerate-output detector (needs no golden values): judged {degenerate.judged} "
        f"responses, flagged {degenerate.flagged}" + _reasons(degenerate.reasons),
    ]
    if result.mode == RECORD:
        lines.append("- golden comparison: not run (this run records the golden values)")
    elif result.mode == PROBE:
        lines.append("- golden comparison: not run (the probe compares outputs with each other)")
    else:
        lines.append(
            f"- golden comparison: judged {golden.judged} responses, flagged {golden.flagged}"
            + _reasons(golden.reasons)
            + (f"; {golden.not_judged} without a golden value" if golden.not_judged else "")
        )
    lines.append(
        f"- requests without a response to judge (HTTP error, timeout): {result.unanswered}"
    )
    return lines


def _reasons(reasons: dict[str, int]) -> str:
    return (
        f" ({', '.join(f'{name}: {n}' for name, n in sorted(reasons.items()))})" if reasons else ""
    )


def probe_lines(numbers: dict[str, Any]) -> list[str]:
    """The determinism probe's table: per prompt, its verdict and where its outputs part."""
    lines = [
        "## Determinism probe (report only)",
        "",
        "| prompt | verdict | differences |",
        "| --- | --- | --- |",
    ]
    for prompt, found in numbers.get("results", {}).items():
        differences = "; ".join(
            f"{name}: parts after {diff['common_prefix_chars']} chars "
            f"({diff['first']!r} / {diff['second']!r})"
            for name, diff in found["differences"].items()
        )
        cells = (prompt, found["verdict"], differences or "-")
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return lines


def write_certificate(result: CertificationResult, directory: Path) -> dict[str, Path]:
    """Write the certificate files (HTML only when matplotlib is available)."""
    paths = {
        "json": write_atomic(
            directory / JSON_NAME, json.dumps(certificate_data(result), indent=2) + "\n"
        ),
        "markdown": write_atomic(directory / MARKDOWN_NAME, markdown(result)),
    }
    from vmtests.certify import html  # noqa: PLC0415  (optional plotting, loaded late)

    page = html.render(result)
    if page is not None:
        paths["html"] = write_atomic(directory / HTML_NAME, page)
    return paths
