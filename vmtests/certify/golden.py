"""Golden output shas: recorded once on an accepted configuration, never by the judged run.

``vmtests/certify/golden/<profile>.json`` holds, per server identity (vLLM version, served
model and model path, as ``/version`` and ``/v1/models`` report them), the sha256 of each
frozen prompt's output at temperature 0, with the sha of the prompt text and ``max_tokens``,
so that a changed prompt or budget is an error instead of a silent mismatch:

    {"profile": "cfx-llm2",
     "servers": {"<server key>": {"recorded_at": "...", "config_digest": "sha256:...",
                                  "outputs": {"smoke-1": {"sha256": "...",
                                                          "prompt_sha256": "...",
                                                          "max_tokens": 48}}}}}

Only ``vmtests certify --record-golden`` writes these files. A missing file, a missing server
entry or a missing prompt is an error (``GoldenMissing``), never a pass.
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


class GoldenMissing(LookupError):
    """No golden value exists for what is being judged: an error, never a pass."""


@dataclass(frozen=True)
class Verdict:
    """The comparison of one output with its golden value."""

    ok: bool
    message: str


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

    def judge(self, spec: RequestSpec, output_sha: str) -> Verdict:
        """Compare one output's sha with the golden value of its prompt."""
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
        if entry["sha256"] != output_sha:
            return Verdict(
                False,
                f"output sha {output_sha[:16]}... differs from golden {entry['sha256'][:16]}...",
            )
        return Verdict(True, f"output sha equals golden {output_sha[:16]}...")

    def record(self, shas: Mapping[RequestSpec, str], config_digest: str) -> Path:
        """Write the golden values of ``shas`` (spec -> output sha) for this server."""
        document = self._document()
        document["profile"] = self.profile
        document.setdefault("servers", {})[self.key] = {
            "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "config_digest": config_digest,
            "outputs": {
                spec.prompt_id: {
                    "sha256": sha,
                    "prompt_sha256": sha256_text(spec.prompt),
                    "max_tokens": spec.max_tokens,
                }
                for spec, sha in sorted(shas.items(), key=lambda item: item[0].prompt_id)
            },
        }
        return write_atomic(self.path, json.dumps(document, indent=2, sort_keys=True) + "\n")
