"""The stub honours an API key as vLLM 0.16 does: 401 ``{"error": "Unauthorized"}`` on ``/v1``
paths without ``Authorization: Bearer <key>``, ``/health`` and ``/metrics`` open, ``--api-key``
over ``$VLLM_API_KEY``, and the key never in the clear in the log once redacted."""

from __future__ import annotations

import pytest
import requests
from stub_support import BASELINE_ARGS, HTTP_TIMEOUT, MODEL, StartServer, post

from vmtests.contracts.serving import API_KEY_VARIABLE
from vmtests.scenario.collection.redact import redact_text

BODY = {"model": MODEL, "prompt": "Explain a prefix cache.", "max_tokens": 4}


def _get(url: str, path: str, key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return requests.get(url + path, headers=headers, timeout=HTTP_TIMEOUT)


@pytest.mark.parametrize(
    ("args", "env", "key"),
    [
        ([], {API_KEY_VARIABLE: "env-key"}, "env-key"),
        (["--api-key", "cli-one", "cli-two"], {API_KEY_VARIABLE: "env-key"}, "cli-two"),
    ],
    ids=["environment", "command-line"],
)
def test_v1_needs_the_bearer_key(
    start_server: StartServer, args: list[str], env: dict[str, str], key: str
) -> None:
    server = start_server([*BASELINE_ARGS, *args], env)
    for path in ("/health", "/metrics", "/version"):
        assert _get(server.url, path).status_code == 200, path
    missing = _get(server.url, "/v1/models")
    assert (missing.status_code, missing.json()) == (401, {"error": "Unauthorized"})
    assert _get(server.url, "/v1/models", "wrong").status_code == 401
    assert post(server.url, "/v1/completions", BODY).status_code == 401
    assert _get(server.url, "/v1/models", key).status_code == 200
    lower = {"Authorization": f"bearer {key}"}  # the scheme in any case, as vLLM
    assert post(server.url, "/v1/completions", BODY, headers=lower).status_code == 200
    if args:  # --api-key wins: the environment's key no longer opens /v1
        assert _get(server.url, "/v1/models", "env-key").status_code == 401


def test_no_key_means_open(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {API_KEY_VARIABLE: ""})
    assert _get(server.url, "/v1/models").status_code == 200


def test_the_logged_arguments_carry_the_key_until_redacted(start_server: StartServer) -> None:
    """vLLM logs ``non-default args`` with the key in it: the suite's redaction must catch it."""
    server = start_server([*BASELINE_ARGS, "--api-key", "s3cret-key"])
    line = next(text for text in server.output().splitlines() if "non-default args" in text)
    assert "s3cret-key" in line
    assert "s3cret-key" not in redact_text(line)
