"""The container branch of ``check_restarted_after_change``: the running container (``docker
inspect``) against the unit's start script as NixOS renders it, read back by
``parse_container_run``. Snapshots go through ``parse_snapshot`` so that redaction applies as in
a real run."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from vmtests.contracts.findings import Check
from vmtests.scenario.collection.collect import FILE_MARK, MARK, parse_snapshot
from vmtests.scenario.collection.redact import REDACTED, redact_text
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.container_run import parse_container_run
from vmtests.scenario.judgement.results import failures
from vmtests.scenario.judgement.sources import check_restarted_after_change

DATA = Path(__file__).with_name("data")
INSPECT = DATA / "docker-inspect-tenstorrent-serving.json"
START_SCRIPT = DATA / "tenstorrent-serving-start-cfx-llm2.sh"
SCRIPT_PATH = (
    "/nix/store/3q5ilbf2qmx787igs23jiyji7xbwjj61-unit-script-tenstorrent-serving-start"
    "/bin/tenstorrent-serving-start"
)
API_KEY = ["--api-key", "sk-prod-0123456789"]


def _inspect(drop_api_key: bool = True) -> str:
    """The docker inspect sample; by default as the script starts it (no --api-key)."""
    data = json.loads(INSPECT.read_text())
    if drop_api_key:
        data[0]["Args"] = [arg for arg in data[0]["Args"] if arg not in API_KEY]
    return json.dumps(data)


def _snapshot(script: str | None, inspect: str) -> Snapshot:
    exec_start = (
        f"ExecStart={{ path={SCRIPT_PATH} ; argv[]={SCRIPT_PATH} ; ignore_errors=no ; "
        "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }"
    )
    sources = ""
    if script is not None:
        sources = f"{FILE_MARK}{SCRIPT_PATH} {base64.b64encode(script.encode()).decode()}\n"
    output = (
        f"{MARK}unit\n{exec_start}\nNeedDaemonReload=no\n{MARK}unit_sources\n{sources}"
        f"{MARK}container\n{inspect}\n{MARK}end\n"
    )
    snapshot = parse_snapshot(output, "S1")
    assert snapshot.server is not None
    assert snapshot.server.origin == "container"
    return snapshot


def _failed(script: str | None, inspect: str | None = None) -> list[str]:
    results = check_restarted_after_change(_snapshot(script, inspect or _inspect()))
    assert {result.check for result in results} == {Check.NOT_RESTARTED}
    return [result.message for result in failures(results)]


def _script() -> str:
    return START_SCRIPT.read_text()


def test_the_rendered_script_reads_back_as_its_container() -> None:
    run = parse_container_run(_script())
    assert run is not None
    assert (run.backend, run.image) == ("docker", "tenstorrent/vllm-qwen36:latest")
    assert run.environment == {"QWEN36_MERGE_BATCH_GUARD": "1", "QWEN36_SDPA_STREAMING": "1"}
    assert run.args[:2] == ["--model", "/models/qwen36"]
    assert run.args[-2:] == ["--tool-call-parser", "qwen3_coder"]
    assert "--stop-timeout=60" not in run.args  # an option of docker run, not of the server


def test_options_in_every_spelling_are_read() -> None:
    script = (
        "/usr/bin/podman --log-level=debug run -it -eA=1 --env B=2 --env=C=3 -e HOST_ONLY "
        "-v /a:/b --shm-size 16g -- img:1 serve --x 'y z'\n"
    )
    run = parse_container_run(script)
    assert run is not None
    assert (run.backend, run.image) == ("podman", "img:1")
    assert run.environment == {"A": "1", "B": "2", "C": "3"}
    assert run.args == ["serve", "--x", "y z"]
    assert parse_container_run("#!/bin/sh\nset -e\nexec python3 -m server\n") is None
    assert parse_container_run("exec docker run --rm\n") is None  # no image


def test_the_matching_container_passes() -> None:
    assert _failed(_script()) == []


def test_a_changed_flag_in_the_script_fails() -> None:
    script = _script().replace("--no-async-scheduling", "--async-scheduling")
    (message,) = _failed(script)
    assert "now passes" in message
    assert "--async-scheduling" in message
    assert "the unit changed but the service was not restarted" in message


def test_a_changed_environment_value_fails() -> None:
    script = _script().replace("QWEN36_SDPA_STREAMING=1", "QWEN36_SDPA_STREAMING=0")
    (message,) = _failed(script)
    assert "QWEN36_SDPA_STREAMING=0 (running: 1)" in message
    assert "not restarted" in message


def test_a_variable_the_container_lacks_fails() -> None:
    script = _script().replace("--rm", "-e QWEN36_DEVICE_RESIDENT=1 \\\n  --rm")
    (message,) = _failed(script)
    assert "QWEN36_DEVICE_RESIDENT=1 (running: unset)" in message


def test_a_container_started_with_more_arguments_fails() -> None:
    """The sample as docker inspect printed it carries an --api-key the script does not pass."""
    (message,) = _failed(_script(), _inspect(drop_api_key=False))
    assert "now passes" in message
    assert "sk-prod" not in message


def test_a_missing_script_fails_naming_the_file() -> None:
    (message,) = _failed(None)
    assert SCRIPT_PATH in message
    assert "is not in the snapshot" in message


def test_a_script_without_a_container_run_fails() -> None:
    (message,) = _failed("#!/bin/sh\nexec python3 -m server\n")
    assert "runs no `docker run` or `podman run`" in message


@pytest.mark.parametrize("different", [False, True])
def test_redacted_values_are_not_compared(different: bool) -> None:
    """A secret in the script and in the container is redacted on both sides: neither an equal
    nor a different value can be told apart, and none of them reaches a message."""
    key, token = ("sk-other", "hf_other") if different else ("sk-prod-0123456789", "hf_prodsecret")
    script = _script().replace("--rm", f"-e HF_TOKEN={token} \\\n  --rm").rstrip("\n") + (
        f" \\\n  --api-key \\\n  {key}\n"
    )
    snapshot = _snapshot(script, _inspect(drop_api_key=False))
    assert key not in snapshot.unit.sources[SCRIPT_PATH]
    assert snapshot.server is not None
    assert snapshot.server.environment["HF_TOKEN"] == REDACTED
    assert failures(check_restarted_after_change(snapshot)) == []


def test_a_value_redacted_on_one_side_only_is_not_compared() -> None:
    """A secret inside a non-secret variable: the script's text is redacted, the container's
    variable (its name names no secret) is not; the two cannot be compared."""
    data = json.loads(_inspect())
    data[0]["Config"]["Env"].append("VLLM_EXTRA=--api-key sk-1")
    script = _script().replace("--rm", "-e 'VLLM_EXTRA=--api-key sk-1' \\\n  --rm")
    snapshot = _snapshot(script, json.dumps(data))
    assert "sk-1" not in snapshot.unit.sources[SCRIPT_PATH]
    assert failures(check_restarted_after_change(snapshot)) == []


def test_secret_flags_are_redacted_across_line_continuations_and_quotes() -> None:
    """oci-containers.nix puts each word on its own line and quotes values with spaces."""
    text = "exec docker run img \\\n  --api-key \\\n  sk-1 \\\n  --hf-token 'a b' \\\n  --port 8000"
    redacted = redact_text(text)
    assert "sk-1" not in redacted
    assert "a b" not in redacted
    run = parse_container_run(redacted)
    assert run is not None
    assert run.args == ["--api-key", REDACTED, "--hf-token", REDACTED, "--port", "8000"]
