"""Synthetic snapshots for the unit tests of the checks: a healthy, durable serving unit.

``good_snapshot(profile)`` describes the state a correct switch to ``cfx-llm2`` or
``resident`` leaves behind (argv, environment, banners, module banner, hugepages, unit files),
written by hand as the module would produce it. Each test then breaks one thing and asserts
that exactly the right check catches it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess

from vmtests.driver.machine import CommandResult, Machine
from vmtests.scenario.collection import snapshot as state
from vmtests.scenario.collection.snapshot import Snapshot

BOOT = "11111111-2222-3333-4444-555555555555"
EARLIER_BOOT = "99999999-2222-3333-4444-555555555555"
INVOCATION = "0e803f238ac54baca08432699bcebecc"
UNIT_FILE = "/etc/systemd/system/tenstorrent-serving.service"
HUGEPAGES_FILE = "/etc/systemd/system/tenstorrent-hugepages.service"
GIB_KIB = 1048576

CFX_ARGS = [
    "--model",
    "/models/qwen36",
    "--served-model-name",
    "qwen36",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--block-size",
    "64",
    "--enable-prefix-caching",
    "--mamba-cache-mode",
    "align",
    "--no-async-scheduling",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "qwen3_coder",
]
CFX_ENV = {"QWEN36_MERGE_BATCH_GUARD": "1", "QWEN36_SDPA_STREAMING": "1"}
RESIDENT_ENV = CFX_ENV | {"QWEN36_DEVICE_RESIDENT": "1", "QWEN36_DEVICE_ARGMAX": "1"}


def module_banner(resident: bool, digest: str = "sha256:" + "ab" * 32) -> str:
    """The module banner line for cfx-llm2 (or resident)."""
    on = "on" if resident else "off"
    return (
        "tenstorrent-serving-config: prefix-caching=on mamba-cache-mode=align "
        f"async-scheduling=off device-resident={on} device-argmax={on} sdpa-streaming=on "
        "merge-batch-guard=on tool-calling=on tool-call-parser=qwen3_coder hugepages=2x1G "
        f"digest={digest}"
    )


# What vLLM v1/engine/core.py logs and v1/metrics/loggers.py publishes for cfx-llm2/resident.
ENGINE_LINE = (
    "(EngineCore_DP0 pid=594) INFO 11-30 01:33:58 [core.py:93] Initializing a V1 LLM engine "
    "(v0.16.0) with config: model='/models/qwen36', speculative_config=None, "
    "tokenizer='/models/qwen36', max_seq_len=32768, served_model_name=qwen36, "
    "enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, "
    "compilation_config={'level': 0, 'cache_dir': ''}"
)
CACHE_CONFIG_INFO = (
    'vllm:cache_config_info{block_size="64",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",mamba_block_size="64",mamba_cache_mode="align",'
    'prefix_caching_hash_algo="sha256",sliding_window="None"} 1.0'
)


def startup_lines(resident: bool) -> list[str]:
    """The unit's startup log of one start: module banner, vLLM lines, feature banners."""
    prefix = "(APIServer pid=594) INFO 11-30 01:33:58 [api_server.py:1] "
    banners = ["qwen36: SDPA streaming ACTIVE", "qwen36: merge batch guard ACTIVE"]
    if resident:
        banners = [
            "qwen36: Phase 2a device-resident decode chain ACTIVE",
            "qwen36: on-device argmax sampling ACTIVE",
            *banners,
        ]
    return [
        "Starting tenstorrent-serving.service...",
        module_banner(resident),
        prefix + "Asynchronous scheduling is disabled.",
        prefix + "Automatic prefix caching is enabled",
        ENGINE_LINE,
        prefix + '"auto" tool choice has been enabled.',
        *(prefix + banner for banner in banners),
        prefix + "qwen36: prefix caching ACTIVE (mamba cache mode align, prefix sidecars "
        "synchronous)",
        prefix + "qwen36: tool calling ACTIVE (parser qwen3_coder)",
        "Started tenstorrent-serving.service.",
    ]


def good_snapshot(resident: bool = False, label: str = "S1") -> Snapshot:
    """A snapshot of a correct, durable, healthy switch to cfx-llm2 (or resident)."""
    environment = RESIDENT_ENV if resident else CFX_ENV
    argv = ["/usr/bin/python3", "-m", "vmtests.stub.server", *CFX_ARGS]
    unit_environment = {"PYTHONPATH": "/opt/vmtests"} | environment
    exec_start = (
        f"{{ path=/usr/bin/python3 ; argv[]={' '.join(argv)} ; ignore_errors=no ; "
        "start_time=[Mon 2026-11-30 01:33:57 UTC] ; stop_time=[n/a] ; pid=594 ; code=(null) ; "
        "status=0/0 }"
    )
    unit_text = "\n".join(
        [
            "[Service]",
            *(f'Environment="{k}={v}"' for k, v in unit_environment.items()),
            "ExecStart=/usr/bin/python3 -m vmtests.stub.server " + " ".join(CFX_ARGS),
        ]
    )
    unit = state.UnitState(
        name="tenstorrent-serving.service",
        properties={
            "ActiveState": "active",
            "MainPID": "594",
            "InvocationID": INVOCATION,
            "FragmentPath": UNIT_FILE,
            "DropInPaths": "",
            "ExecStart": exec_start,
            "NeedDaemonReload": "no",
            "UnitFileState": "enabled",
            "LoadState": "loaded",
            "ControlGroup": "/system.slice/tenstorrent-serving.service",
            "NRestarts": "0",
            "ExecMainCode": "0",
            "ExecMainStatus": "0",
        },
        files={UNIT_FILE: unit_text},
        environment=unit_environment,
    )
    process_env = {"PATH": "/usr/bin", "INVOCATION_ID": INVOCATION, **unit_environment}
    process = state.ProcessState(
        "main-pid", 594, argv, process_env, "0::/system.slice/tenstorrent-serving.service"
    )
    listener = copy.deepcopy(process)
    listener.origin = "listener"
    hugepage_unit = state.UnitState(
        name="tenstorrent-hugepages.service",
        properties={
            "LoadState": "loaded",
            "UnitFileState": "enabled",
            "ActiveState": "active",
            "FragmentPath": HUGEPAGES_FILE,
        },
    )
    models = {"object": "list", "data": [{"id": "qwen36", "object": "model"}]}
    return Snapshot(
        label=label,
        boot_id=BOOT,
        kernel_cmdline="root=/dev/vda rw console=ttyS0",
        unit=unit,
        main_process=process,
        listener=listener,
        manager_environment={"LANG": "C.UTF-8", "PATH": "/usr/bin"},
        journal=[
            state.JournalLine(text, BOOT, INVOCATION, 1000 + i)
            for i, text in enumerate(startup_lines(resident))
        ],
        health=state.Endpoint("http://127.0.0.1:8000/health", 200),
        models=state.Endpoint("http://127.0.0.1:8000/v1/models", 200, json.dumps(models)),
        metrics=state.Endpoint("http://127.0.0.1:8000/metrics", 200, CACHE_CONFIG_INFO),
        hugepages=state.HugepageState(pools={GIB_KIB: 2, 2048: 0}, unit=hugepage_unit),
    )


class CommandsOnly(Machine):
    """A test double that only runs commands (``_run``): starting, stopping and rebooting it do
    nothing unless a subclass says otherwise."""

    def _start(self) -> None: ...
    def _shutdown(self, timeout: float) -> None: ...
    def _crash(self) -> None: ...
    def _close(self) -> None: ...
    def _issue_reboot(self) -> None: ...
    def _wait_until_answering(self, deadline: float) -> None: ...


class LocalShell(CommandsOnly):
    """Stands in for a machine: runs each command with this host's ``sh`` and ``path`` as its
    ``PATH`` (fake tools first), so that a script meant for the guest runs against them."""

    name = "local"

    def __init__(self, path: str) -> None:
        self.path = path

    def _run(self, command: str, timeout: float) -> CommandResult:
        """``sh -c command``: rc, stdout and stderr."""
        done = subprocess.run(
            ["sh", "-c", command],
            capture_output=True,
            env={**os.environ, "PATH": self.path},
            timeout=timeout,
            check=False,
        )
        return CommandResult(command, done.returncode, done.stdout, done.stderr)
