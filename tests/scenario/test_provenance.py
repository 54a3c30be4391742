"""Provenance of every serving-relevant live value (vmtests.scenario.judgement.provenance)."""

from __future__ import annotations

import pytest
from scenario_support import CFX_ARGS, UNIT_FILE, good_snapshot

from vmtests.contracts.findings import Check, Finding, Reason
from vmtests.profiles.loader import load_profile
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.judgement.provenance import check_provenance, sourced_files
from vmtests.scenario.judgement.results import failures

CFX = load_profile("cfx-llm2")
RUN_ENV = "/run/tenstorrent-serving/features.env"


def _unit_without(snapshot: Snapshot, needle: str) -> None:
    text = snapshot.unit.files[UNIT_FILE]
    snapshot.unit.files[UNIT_FILE] = "\n".join(
        line for line in text.splitlines() if needle not in line
    )


def test_every_live_value_of_the_correct_configuration_is_traced_to_the_unit_file() -> None:
    results = check_provenance(good_snapshot())
    assert failures(results) == []
    by_subject = {r.subject: r.message for r in results}
    assert by_subject["QWEN36_SDPA_STREAMING"] == (
        f"QWEN36_SDPA_STREAMING=1 comes from unit file {UNIT_FILE}"
    )
    assert by_subject["--enable-prefix-caching"] == (
        f"`--enable-prefix-caching` comes from unit file {UNIT_FILE}"
    )
    assert "PATH" not in by_subject  # not serving-relevant


def test_a_variable_from_an_environment_file_under_run_is_flagged() -> None:
    snapshot = good_snapshot()
    _unit_without(snapshot, "QWEN36_SDPA_STREAMING")
    snapshot.unit.files[UNIT_FILE] += f"\nEnvironmentFile={RUN_ENV}"
    snapshot.unit.properties["EnvironmentFiles"] = f"{RUN_ENV} (ignore_errors=no)"
    snapshot.unit.sources[RUN_ENV] = "QWEN36_SDPA_STREAMING=1\n"
    (bad,) = failures(evaluate_stage(CFX, snapshot))
    assert bad.finding == Finding(Check.PROVENANCE, Reason.RUNTIME_ENV_FILE)
    assert bad.subject == "QWEN36_SDPA_STREAMING"
    assert bad.message == (
        "after the switch (S1): QWEN36_SDPA_STREAMING=1 reaches the server from "
        f"EnvironmentFile {RUN_ENV} ({RUN_ENV} is under /run (runtime-only)): it will be gone "
        "after the next reboot"
    )


def test_flags_from_a_durable_wrapper_that_sources_a_run_file_are_flagged() -> None:
    snapshot = good_snapshot()
    wrapper = "/usr/local/bin/serving-wrapper"
    flags = "/run/tenstorrent-serving/flags.sh"
    _unit_without(snapshot, "ExecStart=")
    snapshot.unit.files[UNIT_FILE] += f"\nExecStart={wrapper}"
    snapshot.unit.sources[wrapper] = (
        f"#!/bin/sh\n. {flags}\nexec /usr/bin/python3 -m vmtests.stub.server $FLAGS\n"
    )
    snapshot.unit.sources[flags] = f'FLAGS="{" ".join(CFX_ARGS)}"\n'
    bad = [r for r in failures(check_provenance(snapshot)) if r.subject == "--no-async-scheduling"]
    assert len(bad) == 1
    assert bad[0].finding == Finding(Check.PROVENANCE, Reason.RUNTIME_SOURCED_FILE)
    assert bad[0].message == (
        "after the switch (S1): `--no-async-scheduling` reaches the server from "
        f"{flags} (read by the wrapper script {wrapper}) ({flags} is under /run "
        "(runtime-only)): it will be gone after the next reboot"
    )


def test_docker_env_file_under_run_is_flagged() -> None:
    snapshot = good_snapshot()
    _unit_without(snapshot, "QWEN36_MERGE_BATCH_GUARD")
    env_file = "/run/serving/docker.env"
    snapshot.unit.files[UNIT_FILE] += f"\nExecStartPre=/bin/true --env-file {env_file}"
    snapshot.unit.sources[env_file] = "QWEN36_MERGE_BATCH_GUARD=1\n"
    (bad,) = failures(check_provenance(snapshot))
    assert bad.reason == Reason.RUNTIME_ENV_FILE
    assert f"from docker --env-file {env_file}" in bad.message


@pytest.mark.parametrize(
    "env_file", ["/run/secrets/vllm-api-key.env", "/run/agenix/vllm-api-key.env"]
)
def test_a_secret_manager_file_under_run_is_durable(env_file: str) -> None:
    """sops-nix and agenix decrypt secrets under /run at every activation, boot included: a
    key the container reads from there is configuration, not runtime state."""
    snapshot = good_snapshot()
    snapshot.unit.files[UNIT_FILE] += f"\nExecStartPre=/bin/true --env-file {env_file}"
    snapshot.unit.sources[env_file] = "VLLM_API_KEY=<redacted>\n"
    assert snapshot.server is not None
    snapshot.server.environment["VLLM_API_KEY"] = "<redacted>"
    assert failures(check_provenance(snapshot)) == []
    traced = next(r for r in check_provenance(snapshot) if r.subject == "VLLM_API_KEY")
    assert f"comes from docker --env-file {env_file}" in traced.message


def test_an_environment_generator_under_run_is_flagged() -> None:
    snapshot = good_snapshot()
    snapshot.env_generators = ["/run/systemd/system-environment-generators/50-serving"]
    (bad,) = failures(check_provenance(snapshot))
    assert bad.reason == Reason.RUNTIME_GENERATOR
    assert "environment generator /run/systemd/system-environment-generators/50-serving" in (
        bad.message
    )


def test_an_unrelated_manager_variable_is_information_only() -> None:
    """systemctl set-environment EDITOR=vi reaches every service; it must not fail a run."""
    snapshot = good_snapshot()
    snapshot.manager_environment["EDITOR"] = "vi"
    assert snapshot.server is not None
    snapshot.server.environment["EDITOR"] = "vi"
    results = evaluate_stage(CFX, snapshot)
    assert failures(results) == []
    (note,) = [r for r in results if r.check == Check.UNRELATED]
    assert note.informational
    assert note.message == (
        "EDITOR is set in the service manager's environment but does not configure serving "
        "(information only)"
    )


def test_a_serving_variable_in_the_manager_environment_still_fails() -> None:
    snapshot = good_snapshot()
    snapshot.manager_environment["VLLM_USE_V1"] = "1"
    assert snapshot.server is not None
    snapshot.server.environment["VLLM_USE_V1"] = "1"
    bad = failures(evaluate_stage(CFX, snapshot))
    assert [r.check for r in bad] == [Check.MANAGER_ENVIRONMENT]


def test_an_unrelated_runtime_drop_in_is_information_only() -> None:
    snapshot = good_snapshot()
    drop_in = "/run/systemd/system/tenstorrent-serving.service.d/50-weight.conf"
    snapshot.unit.properties["DropInPaths"] = drop_in
    snapshot.unit.files[drop_in] = "[Service]\nCPUWeight=50\n"
    results = evaluate_stage(CFX, snapshot)
    assert failures(results) == []
    notes = [r for r in results if r.check == Check.UNRELATED]
    assert [n.subject for n in notes] == [drop_in]
    assert "sets only CPUWeight" in notes[0].message


def test_a_serving_runtime_drop_in_still_fails() -> None:
    snapshot = good_snapshot()
    drop_in = "/run/systemd/system/tenstorrent-serving.service.d/50-env.conf"
    snapshot.unit.properties["DropInPaths"] = drop_in
    snapshot.unit.files[drop_in] = '[Service]\nEnvironment="TT_LOGGER_LEVEL=debug"\n'
    bad = failures(evaluate_stage(CFX, snapshot))
    assert [r.check for r in bad] == [Check.RUNTIME_DROP_IN]


def test_sourced_files_of_a_script() -> None:
    script = "#!/bin/sh\n. /run/a.sh\nsource /etc/b.env; exec x --env-file=/run/c.env\n"
    assert sourced_files(script) == ["/run/a.sh", "/etc/b.env", "/run/c.env"]


def test_docker_env_file_in_the_start_script_is_named_as_such() -> None:
    # oci-containers renders environmentFiles into the start script, not the unit file.
    snapshot = good_snapshot()
    _unit_without(snapshot, "QWEN36_MERGE_BATCH_GUARD")
    env_file = "/run/serving/docker.env"
    script = "/usr/lib/vmtests/store/x-tenstorrent-serving-start/bin/tenstorrent-serving-start"
    snapshot.unit.sources[script] = f"#!/bin/bash\nexec docker run --env-file {env_file} image\n"
    snapshot.unit.sources[env_file] = "QWEN36_MERGE_BATCH_GUARD=1\n"
    (bad,) = failures(check_provenance(snapshot))
    assert bad.reason == Reason.RUNTIME_ENV_FILE
    assert bad.message == (
        "after the switch (S1): QWEN36_MERGE_BATCH_GUARD=1 reaches the server from docker "
        f"--env-file {env_file} ({env_file} is under /run (runtime-only)): it will be gone "
        "after the next reboot"
    )


def test_an_env_file_under_run_taints_variables_not_the_script_s_flags() -> None:
    """A durable start script that passes ``--env-file /run/...``: the variables may come from
    the file, the flags written in the script cannot."""
    snapshot = good_snapshot()
    _unit_without(snapshot, "QWEN36_MERGE_BATCH_GUARD")
    _unit_without(snapshot, "ExecStart=")
    env_file = "/run/serving/docker.env"
    script = "/usr/lib/vmtests/store/x-tenstorrent-serving-start/bin/tenstorrent-serving-start"
    snapshot.unit.sources[script] = (
        f"#!/bin/bash\nexec docker run --env-file {env_file} image {' '.join(CFX_ARGS)}\n"
    )
    snapshot.unit.sources[env_file] = "QWEN36_MERGE_BATCH_GUARD=1\n"
    bad = failures(check_provenance(snapshot))
    assert [(r.subject, r.reason) for r in bad] == [
        ("QWEN36_MERGE_BATCH_GUARD", Reason.RUNTIME_ENV_FILE)
    ]
