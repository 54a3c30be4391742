"""What the first-run VM tests share: one reference guest with the base configuration deployed
by ``vmtests check --target qemu:reference`` itself, reached afterwards over ``ssh://`` (its
sshd, the host key pinned) as a real host is; helpers that change it for one test and put it
back, and the CLI driven as a person drives it."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from vmtests import cli
from vmtests.contracts.serving import API_KEY_VARIABLE, SERVING_PORT, SERVING_UNIT
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.access import record_known_hosts
from vmtests.profiles import load_profile
from vmtests.scenario.install.reference_switch import ReferenceSwitch, install_units
from vmtests.scenario.install.switching import wait_ready

API_KEY_FILE = "/run/secrets/vllm-api-key.env"
"""Where a NixOS host's secret manager (sops-nix, agenix) puts a secret, and so the key here."""
API_KEY = "sk-first-run-0123456789"


@dataclass(frozen=True)
class CliRun:
    """One ``vmtests`` command line: its exit status and what it printed."""

    status: int
    out: str
    err: str


def run_cli(*argv: str) -> CliRun:
    """Run ``vmtests argv`` in this process, as the console script would; what it printed is
    kept (and printed again, for the test's log)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(argv))
    print(out.getvalue(), err.getvalue(), sep="\n")
    return CliRun(status, out.getvalue(), err.getvalue())


def ssh_target(machine: QemuMachine, state_dir: Path, **options: object) -> str:
    """``ssh://root@127.0.0.1:<port>?identity_file=...&known_hosts=...&<options>``."""
    assert machine.ssh_key is not None
    known_hosts = record_known_hosts(machine, state_dir / "known_hosts")
    pairs = {"identity_file": machine.ssh_key, "known_hosts": known_hosts, **options}
    query = "&".join(f"{name}={value}" for name, value in pairs.items())
    return f"ssh://root@127.0.0.1:{machine.ssh_port}?{query}"


def invocation_id(machine: QemuMachine) -> str:
    """The serving unit's current InvocationID."""
    return machine.succeed(f"systemctl show -p InvocationID --value {SERVING_UNIT}").strip()


def base_switch() -> ReferenceSwitch:
    """The reference switch of the base configuration the guest runs (baseline)."""
    baseline = load_profile("baseline")
    return ReferenceSwitch(baseline, base_serving_profile=baseline.serving_profile)


def restart(machine: QemuMachine) -> None:
    """Restart the serving unit and wait until it answers."""
    machine.succeed(f"systemctl restart {SERVING_UNIT}", timeout=360)
    wait_ready(machine, SERVING_PORT, timeout=300)


@contextmanager
def api_key_required(machine: QemuMachine) -> Iterator[str]:
    """The base configuration with its container given ``VLLM_API_KEY`` from an environment
    file, as a host hands the container a secret (oci-containers ``environmentFiles``); yields
    the file's path. The base units are back when the block ends."""
    switch = base_switch()
    switch.prepare_base(machine)  # serves the base already: only reads what is installed
    machine.write_file(API_KEY_FILE, f"{API_KEY_VARIABLE}={API_KEY}\n")
    keyed = replace(switch.base, environment_files=(API_KEY_FILE,))
    try:
        install_units(machine, keyed)
        yield API_KEY_FILE
    finally:
        machine.succeed(f"rm -f {API_KEY_FILE}")
        install_units(machine, switch.base)


def profile_expecting_more(directory: Path, banner: str) -> Path:
    """cfx-llm2's expectations plus a banner its configuration never logs: a switch to it
    succeeds, and S1 fails."""
    document = yaml.safe_load(load_profile("cfx-llm2").source.read_text())
    document["name"] = "cfx-llm2-expecting-more"
    document["banners"]["present"].append({"name": "never-logged", "pattern": banner})
    path = directory / "cfx-llm2-expecting-more.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def report_table(report: Path, heading: str) -> list[list[str]]:
    """The rows of the first Markdown table under ``heading`` in ``report`` (cells stripped)."""
    rows: list[list[str]] = []
    lines = report.read_text().splitlines()
    assert heading in lines, f"{report} has no {heading!r}"
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("| ---"):
            continue
        if line.startswith("| "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows
