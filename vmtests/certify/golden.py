"""Golden output shas, per condition: recorded once on an accepted configuration, never by the
judged run.

vLLM promises reproducible online output only with batch invariance (vLLM docs,
``docs/usage/reproducibility.md``), which needs NVIDIA, AMD or Intel kernels
(``docs/features/batch_invariance.md``), not a Tenstorrent card: a correct server may give
other tokens at another batch size or cache state. So every output is recorded and judged
under its **condition**: the number of requests sent together (``b1``, ``b8``, ``b32``) and
whether the prompt was already sent since the server last started, as far as this run knows
(``cold`` the first time, ``warm`` after). The recording replays the gates themselves, so it
records exactly the conditions they judge.

``vmtests/certify/golden/<profile>.json`` holds, per server identity (vLLM version, served
model and model path, as ``/version`` and ``/v1/models`` report them), for each frozen prompt
the sha of its text, ``max_tokens`` and one output sha per condition, so that a changed prompt
or budget is an error instead of a silent mismatch:

    {"profile": "cfx-llm2",
     "servers": {"<server key>": {"recorded_at": "...", "config_digest": "sha256:...",
                                  "outputs": {"smoke-1": {"prompt_sha256": "...",
                                                          "max_tokens": 48,
                                                          "conditions": {"b1-cold": "..."}}}}}}

Only ``vmtests certify --record-golden`` writes these files. A missing file, server entry,
prompt or condition is an error (``GoldenMissing``), never a pass.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.certify.loadgen import RequestSpec, sha256_text
from vmtests.report import write_atomic

GOLDEN_DIR = Path(__file__).with_name("golden")
COLD, WARM = "cold", "warm"


class GoldenMissing(LookupError):
    """No golden value exists for what is being judged: an error, never a pass."""


@dataclass(frozen=True)
class Verdict:
    """The comparison of one output with its golden value."""

    ok: bool
    message: str


def condition(batch: int, warm: bool) -> str:
    """The condition key of a request: ``b<requests sent together>-<cold|warm>``."""
    return f"b{batch}-{WARM if warm else COLD}"


def golden_path(profile: str, directory: Path = GOLDEN_DIR) -> Path:
    """The golden file of ``profile``."""
    return directory / f"{profile}.json"


def server_key(version: str, model_id: str, model_root: str) -> str:
    """The identity of the serving stack whose outputs are recorded."""
    return f"vllm {version} | model {model_id} | {model_root}"


class GoldenStore:
    """The golden values of one profile for one server identity."""

    def __init__(self, profile: str, key: str, directory: Path = GOLDEN_DIR) -> None:
        self.profile = profile
        self.key = key
        self.path = golden_path(profile, directory)

    def _document(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {"profile": self.profile, "servers": {}}
        data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        return data

    def outputs(self) -> dict[str, Any]:
        """The recorded outputs for this server; raises ``GoldenMissing`` when there are none."""
        if not self.path.is_file():
            raise GoldenMissing(
                f"no golden file {self.path}: record one on an accepted configuration with "
                f"`vmtests certify --profile {self.profile} --record-golden`"
            )
        servers = self._document().get("servers", {})
        if self.key not in servers:
            known = "; ".join(servers) or "none"
            raise GoldenMissing(
                f"{self.path} has no golden values for this server ({self.key}); recorded for: "
                f"{known}. Record them with --record-golden on an accepted configuration"
            )
        outputs: dict[str, Any] = servers[self.key].get("outputs", {})
        return outputs

    def judge(self, spec: RequestSpec, output_sha: str, at: str) -> Verdict:
        """Compare one output's sha with the golden value of its prompt at condition ``at``."""
        entry = self.outputs().get(spec.prompt_id)
        if entry is None:
            raise GoldenMissing(f"{self.path}: no golden value for prompt {spec.prompt_id}")
        if entry.get("prompt_sha256") != sha256_text(spec.prompt):
            raise GoldenMissing(
                f"{self.path}: prompt {spec.prompt_id} changed since its golden value was "
                "recorded; record again on an accepted configuration"
            )
        if entry.get("max_tokens") != spec.max_tokens:
            raise GoldenMissing(
                f"{self.path}: prompt {spec.prompt_id} was recorded with max_tokens "
                f"{entry.get('max_tokens')}, judged with {spec.max_tokens}"
            )
        conditions: dict[str, str] = entry.get("conditions", {})
        if at not in conditions:
            raise GoldenMissing(
                f"{self.path}: prompt {spec.prompt_id} has no golden value at condition {at} "
                f"(recorded: {', '.join(sorted(conditions)) or 'none'}); record with "
                "--record-golden and the same options"
            )
        golden = conditions[at]
        if golden != output_sha:
            return Verdict(
                False,
                f"output sha {output_sha[:16]}... differs from golden {golden[:16]}... at {at}",
            )
        return Verdict(True, f"output sha equals golden {output_sha[:16]}... at {at}")

    def record(
        self,
        shas: Mapping[tuple[RequestSpec, str], str],
        config_digest: str,
        *,
        merge: bool = False,
    ) -> Path:
        """Write the golden values ``shas`` ((spec, condition) -> output sha) for this server:
        they replace its entry, or with ``merge`` (a partial recording) the entries of their
        prompts only."""
        outputs: dict[str, dict[str, Any]] = {}
        ordered = sorted(shas.items(), key=lambda item: (item[0][0].prompt_id, item[0][1]))
        for (spec, at), sha in ordered:
            entry = outputs.setdefault(
                spec.prompt_id,
                {
                    "prompt_sha256": sha256_text(spec.prompt),
                    "max_tokens": spec.max_tokens,
                    "conditions": {},
                },
            )
            entry["conditions"][at] = sha
        document = self._document()
        document["profile"] = self.profile
        if merge:
            known = document.get("servers", {}).get(self.key, {}).get("outputs", {})
            outputs = {**known, **outputs}
        document.setdefault("servers", {})[self.key] = {
            "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "config_digest": config_digest,
            "outputs": outputs,
        }
        return write_atomic(self.path, json.dumps(document, indent=2, sort_keys=True) + "\n")


class GoldenRecorder:
    """Collects one sha per (prompt, condition) during a recording run; a second, different
    sha for the same pair is not reproducible and is refused."""

    def __init__(self) -> None:
        self.shas: dict[tuple[RequestSpec, str], str] = {}

    def add(self, spec: RequestSpec, at: str, sha: str) -> str:
        """Keep ``sha``; return a problem (``""`` when none)."""
        known = self.shas.setdefault((spec, at), sha)
        if known == sha:
            return ""
        return (
            f"not reproducible at {at}: output sha {sha[:16]}... after {known[:16]}... for the "
            "same prompt (no golden value can be recorded for it)"
        )
