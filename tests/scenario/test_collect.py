"""Unit tests of snapshot parsing, redaction and JSON round trips (no machine needed)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import cast

from scenario_support import good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.driver.machine import CommandResult, Machine
from vmtests.scenario.collection.collect import (
    FILE_MARK,
    MARK,
    parse_snapshot,
    snapshot_command,
    take_snapshot,
)
from vmtests.scenario.collection.redact import (
    REDACTED,
    redact_argv,
    redact_environment,
    redact_text,
)
from vmtests.scenario.collection.snapshot import CONTAINER_LOG, Snapshot
from vmtests.scenario.judgement.checks import check_evidence
from vmtests.scenario.judgement.results import failures


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _output(extra_journal: tuple[dict[str, str], ...] = ()) -> str:
    cmdline = (
        b"\0".join(
            [
                b"/usr/bin/python3",
                b"-m",
                b"vmtests.stub.server",
                b"--api-key",
                b"sk-live-123",
                b"--port",
                b"8000",
            ]
        )
        + b"\0"
    )
    environ = b"HF_TOKEN=hf_secret\0QWEN36_SDPA_STREAMING=1\0INVOCATION_ID=abc\0"
    unit_file = b'[Service]\nEnvironment="HF_TOKEN=hf_secret"\nExecStart=/usr/bin/python3\n'
    journal = [
        {
            "MESSAGE": "tenstorrent-serving-config: sdpa-streaming=on digest=sha256:00",
            "_BOOT_ID": "0123456789abcdef0123456789abcdef",
            "_SYSTEMD_INVOCATION_ID": "inv1",
            "__REALTIME_TIMESTAMP": "17",
        },
        {
            "MESSAGE": list(b"qwen36: SDPA streaming ACTIVE \xff"),
            "_BOOT_ID": "0123456789abcdef0123456789abcdef",
            "_SYSTEMD_INVOCATION_ID": "inv1",
        },
        *extra_journal,
    ]
    sections = {
        "boot_id": "01234567-89ab-cdef-0123-456789abcdef",
        "cmdline": "root=/dev/vda console=ttyS0",
        "unit": "ActiveState=active\nMainPID=594\nInvocationID=inv1\nDropInPaths=\n"
        "FragmentPath=/etc/systemd/system/tenstorrent-serving.service\nNeedDaemonReload=no",
        "unit_env": _b64(b'PYTHONPATH=/opt/vmtests "HF_TOKEN=hf_secret" "A=two words"'),
        "unit_files": f"{FILE_MARK}/etc/systemd/system/tenstorrent-serving.service "
        + _b64(unit_file),
        "manager_env": "LANG=C.UTF-8\nPATH=/usr/bin\nAPI_KEY=abc",
        "main_process": f"pid 594\ncmdline {_b64(cmdline)}\nenviron {_b64(environ)}\n"
        f"cgroup {_b64(b'0::/system.slice/tenstorrent-serving.service')}",
        "listener": "",
        "journal": "\n".join(json.dumps(entry) for entry in journal),
        "earlier_journal": "",
        "health": "200",
        "models": '{"object":"list","data":[{"id":"qwen36"}]}\n200',
        "meminfo": "HugePages_Total:       0\nHugepagesize:       2048 kB",
        "hugepage_pools": "1048576kB 2\n2048kB 0",
        "hugepage_unit": "LoadState=loaded\nUnitFileState=enabled",
        "hugepage_unit_files": "",
        "sysctl": "",
        "generations": "/run/current-system /nix/store/abc-nixos-system",
        "container": "",
        "end": "",
    }
    return "".join(f"\n{MARK}{name}\n{text}\n" for name, text in sections.items())


def test_parse_snapshot_reads_every_section_and_redacts_secrets() -> None:
    snapshot = parse_snapshot(_output(), "S1")
    assert snapshot.errors == []
    assert snapshot.unit.main_pid == 594
    assert snapshot.unit.environment == {
        "PYTHONPATH": "/opt/vmtests",
        "HF_TOKEN": REDACTED,
        "A": "two words",
    }
    assert snapshot.argv[3:5] == ["--api-key", REDACTED]
    assert snapshot.environment["HF_TOKEN"] == REDACTED
    assert snapshot.environment["QWEN36_SDPA_STREAMING"] == "1"
    assert snapshot.manager_environment["API_KEY"] == REDACTED
    assert "hf_secret" not in json.dumps(snapshot.to_dict())
    assert snapshot.server is not None
    assert snapshot.server.cgroup.endswith("serving.service")
    assert [line.boot_id for line in snapshot.journal] == [snapshot.boot_id] * 2
    assert snapshot.journal[1].message.startswith("qwen36: SDPA streaming ACTIVE")
    assert next(line.message for line in snapshot.current_lines()).startswith("tenstorrent-")
    assert snapshot.health.status == 200
    assert snapshot.models.status == 200
    assert "qwen36" in snapshot.models.body
    assert snapshot.hugepages.pools == {1048576: 2, 2048: 0}
    assert snapshot.hugepages.unit.unit_file_state == "enabled"
    assert snapshot.generations == {"/run/current-system": "/nix/store/abc-nixos-system"}


def test_truncated_output_and_dead_endpoint_are_reported() -> None:
    text = _output().split(f"{MARK}health")[0]
    text += f"\n{MARK}health\ncurl: (7) Failed to connect\n000\n"
    snapshot = parse_snapshot(text, "S2")
    assert "truncated" in snapshot.errors[0]
    assert snapshot.health.status is None
    assert "Failed to connect" in snapshot.health.error


def test_snapshot_round_trips_through_json() -> None:
    snapshot = good_snapshot()
    data = json.loads(json.dumps(snapshot.to_dict()))
    assert Snapshot.from_dict(data) == snapshot
    # With a container: the container's process is the server, the MainPID its launcher.
    output = f"{MARK}container\n{DOCKER_INSPECT_SAMPLE.read_text()}\n{MARK}end\n"
    inspected = parse_snapshot(output, "S1")
    again = Snapshot.from_dict(json.loads(json.dumps(inspected.to_dict())))
    assert again == inspected
    assert again.container is not None
    assert again.server is again.container.process


def test_snapshot_command_quotes_its_arguments() -> None:
    command = snapshot_command("tenstorrent-serving.service", 8000, "hp.service", "name; rm")
    assert "'name; rm'" in command
    # One script, quoted whole (inside it, tt-smi runs through sh -c "$SMI").
    assert command.count("sh -c '") == 1


def test_redaction_helpers() -> None:
    assert redact_environment({"GITHUB_TOKEN": "x", "PATH": "/bin"}) == {
        "GITHUB_TOKEN": REDACTED,
        "PATH": "/bin",
    }
    assert redact_argv(["--hf-token=abc", "--db-password", "pw", "--port", "1"]) == [
        f"--hf-token={REDACTED}",
        "--db-password",
        REDACTED,
        "--port",
        "1",
    ]
    text = (
        'Environment="OPENAI_API_KEY=sk-1" --api-key sk-2 MODE=align --port 8000 '
        "prompt_tokens=512 --max-tokens 64 --tokenizer /models/q"
    )
    redacted = redact_text(text)
    assert "sk-1" not in redacted
    assert "sk-2" not in redacted
    # Measurements and paths whose names hold a secret's word only as part of another stay.
    assert "MODE=align --port 8000 prompt_tokens=512 --max-tokens 64 --tokenizer /models/q" in (
        redacted
    )


def test_redaction_of_dict_reprs_bearer_headers_and_multi_value_flags() -> None:
    # vLLM logs its arguments as a dict, the --api-key values included.
    line = "non-default args: {'api_key': ['k-one', 'k-two'], 'max_num_seqs': 32, 'port': 8000}"
    assert redact_text(line) == (
        f"non-default args: {{'api_key': '{REDACTED}', 'max_num_seqs': 32, 'port': 8000}}"
    )
    # JSON keeps parsing, and a figure under a secret-looking name is never hidden.
    document = json.loads(redact_text('{"api_key": "k", "prompt_tokens": 12, "tokens": [1, 2]}'))
    assert document == {"api_key": REDACTED, "prompt_tokens": 12, "tokens": [1, 2]}
    assert redact_text("Authorization: Bearer k-3.x") == f"Authorization: Bearer {REDACTED}"
    assert redact_argv(["serve", "--api-key", "a", "b", "--port", "8000"]) == [
        "serve", "--api-key", REDACTED, REDACTED, "--port", "8000",
    ]  # fmt: skip


DOCKER_INSPECT_SAMPLE = Path(__file__).with_name("data") / "docker-inspect-tenstorrent-serving.json"


def test_container_branch_reads_a_real_docker_inspect_sample() -> None:
    """``docker inspect`` of a running serving container (Docker Engine API ContainerInspect
    shape, as docker 28 prints it) becomes the live process: argv, environment, stop timeout."""
    output = (
        f"{MARK}boot_id\nabc\n{MARK}container\n{DOCKER_INSPECT_SAMPLE.read_text()}\n{MARK}end\n"
    )
    snapshot = parse_snapshot(output, "S1")
    assert snapshot.errors == []
    assert snapshot.container is not None
    assert snapshot.container.name == "tenstorrent-serving"
    assert snapshot.container.stop_timeout == 60
    assert snapshot.container.running is True
    process = snapshot.server
    assert process is snapshot.container.process
    assert process is not None
    assert (process.origin, process.pid) == ("container", 2417)
    # Path + Args: the entrypoint's first word belongs to the argv.
    assert process.argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert process.argv[process.argv.index("--mamba-cache-mode") + 1] == "align"
    assert "--no-async-scheduling" in process.argv
    assert "sk-prod-0123456789" not in json.dumps(snapshot.to_dict())
    assert process.environment["HF_TOKEN"] == REDACTED
    assert process.environment["QWEN36_MERGE_BATCH_GUARD"] == "1"


def test_container_inspect_that_failed_is_an_error_not_a_process() -> None:
    text = "Error: No such object: tenstorrent-serving"
    snapshot = parse_snapshot(f"{MARK}container\n{text}\n{MARK}end\n", "S1")
    assert snapshot.container is None
    assert snapshot.server is None
    assert any("container inspect failed" in error for error in snapshot.errors)


class _Answers:
    """Stands in for a machine whose every command prints ``output`` (rc 0): the snapshot
    script's output. ``take_snapshot`` only calls ``execute``."""

    def __init__(self, output: str) -> None:
        self.output = output

    def execute(self, command: str, timeout: float) -> CommandResult:
        return CommandResult(command, 0, self.output.encode(), b"")


def test_a_container_asked_for_but_not_inspected_is_an_error() -> None:
    """No container section at all (say the script could not run the inspect): the snapshot
    says so instead of passing the launcher off as the container."""
    machine = cast(Machine, _Answers(_output()))
    assert take_snapshot(machine, "S1").errors == []
    snapshot = take_snapshot(machine, "S1", container="tenstorrent-serving")
    assert snapshot.container is None
    assert any("tenstorrent-serving was not inspected" in error for error in snapshot.errors)


SUPPRESSED = {
    "MESSAGE": "Suppressed 1234 messages from tenstorrent-serving.service",
    "_BOOT_ID": "0123456789abcdef0123456789abcdef",
    "_SYSTEMD_INVOCATION_ID": "journald-own-invocation",
    "N_DROPPED": "1234",
    "OBJECT_SYSTEMD_INVOCATION_ID": "inv1",
}


class _Commands:
    """A machine answering the snapshot script with ``snapshot`` and the container log
    command with ``log``; records the commands it was sent."""

    def __init__(self, snapshot: str, log: str) -> None:
        self.answers = {"@@vmtests-section": snapshot, "logs --tail": log}
        self.commands: list[str] = []
        self.name = "fake"

    def execute(self, command: str, *args: object, timeout: float) -> CommandResult:
        self.commands.append(command)
        output = next(text for key, text in self.answers.items() if key in command)
        return CommandResult(command, 0, output.encode(), b"")


def test_suppressed_lines_are_failed_evidence_and_the_container_log_is_read() -> None:
    """journald's ``Suppressed N messages`` about the current start is failed evidence with its
    message, and makes the snapshot read the container's own log, whose lines then count as
    lines of the current start (marked as such)."""
    log = "INFO qwen36: merge batch guard ON\nINFO --api-key sk-in-log\n"
    fake = _Commands(_output((SUPPRESSED,)), log)
    snapshot = take_snapshot(cast(Machine, fake), "S1", container="tenstorrent-serving")
    assert len(fake.commands) == 2
    assert [line.dropped for line in snapshot.suppressed()] == [1234]
    suppressed = Finding(Check.SNAPSHOT_EVIDENCE, Reason.JOURNAL_SUPPRESSED)
    (evidence,) = [r for r in failures(check_evidence(snapshot)) if r.finding == suppressed]
    assert "Suppressed 1234 messages from tenstorrent-serving.service" in evidence.message
    fallback = [line for line in snapshot.current_lines() if line.source == CONTAINER_LOG]
    assert [line.message for line in fallback] == [
        "INFO qwen36: merge batch guard ON",
        f"INFO --api-key {REDACTED}",
    ]
    assert Snapshot.from_dict(snapshot.to_dict()).container_log == snapshot.container_log


def test_no_suppression_means_no_container_log_unless_asked() -> None:
    fake = _Commands(_output(), "a line\n")
    machine = cast(Machine, fake)
    assert take_snapshot(machine, "S1", container="tenstorrent-serving").container_log == []
    assert len(fake.commands) == 1
    # A suppression about an earlier start of the unit is not this start's concern.
    earlier = {**SUPPRESSED, "OBJECT_SYSTEMD_INVOCATION_ID": "inv0"}
    snapshot = take_snapshot(cast(Machine, _Commands(_output((earlier,)), "")), "S1")
    assert snapshot.suppressed() == []
    assert failures(check_evidence(snapshot)) == []
    asked = take_snapshot(machine, "S1", container="tenstorrent-serving", container_log=True)
    assert [line.message for line in asked.container_log] == ["a line"]
