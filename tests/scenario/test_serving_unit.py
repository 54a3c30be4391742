"""The reference guest's serving unit is what oci-containers.nix and the module render.

Host-only: the rendered unit, scripts and hugepage units for a configuration, checked against
what nixpkgs ``nixos/modules/virtualisation/oci-containers.nix`` and ``systemd-lib.nix`` emit,
the module's graceful stop, and the start script's command as the shell really runs it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vmtests.guest import toolpath
from vmtests.guest.stub_image import IMAGE
from vmtests.scenario.reference_switch import ServingConfig, render_units
from vmtests.scenario.serving_unit import (
    STORE_DIR,
    escape_shell_arg,
    mount_unit_name,
)
from vmtests.scenario.sources import script_command

IMAGE_FILE = f"{STORE_DIR}/0123-vmtests-stub-vllm.tar.gz"
HUGEPAGES = {"count": 2, "size": "1G", "sizeKiB": 1048576}


def _config(**changes: object) -> ServingConfig:
    config = ServingConfig(
        args=("--model", "/models/qwen36", "--port", "8000", "--additional-config", '{"tt": 1}'),
        environment={"QWEN36_SDPA_STREAMING": "1", "QWEN36_MERGE_BATCH_GUARD": "1"},
        banner="tenstorrent-serving-config: prefix-caching=on digest=sha256:00",
        hugepages=HUGEPAGES,
        stop_timeout=60,
        image=IMAGE,
        image_file=IMAGE_FILE,
    )
    fields = {**config.__dict__, **changes}
    return ServingConfig(**fields)


def _scripts_by_name(config: ServingConfig) -> dict[str, str]:
    rendered = render_units(config)
    return {Path(path).name: text for path, text in rendered.scripts.items()}


def _unit_lines(config: ServingConfig) -> list[str]:
    return render_units(config).units["tenstorrent-serving.service"].splitlines()


def test_escape_shell_arg_matches_nixpkgs_lib() -> None:
    assert escape_shell_arg("/dev/tenstorrent/0") == "/dev/tenstorrent/0"
    assert escape_shell_arg("--stop-timeout=60") == "'--stop-timeout=60'"  # = is not safe
    assert escape_shell_arg("it's") == "'it'\\''s'"
    assert escape_shell_arg('{"tt": 1}') == "'{\"tt\": 1}'"


def test_start_script_is_oci_containers_docker_run() -> None:
    start = _scripts_by_name(_config())["tenstorrent-serving-start"]
    assert start.startswith("#!/bin/bash\nset -e\n\nexec docker  \\\n  run \\\n")
    for word in (
        "--name=tenstorrent-serving",
        "--log-driver=journald",
        "-e QWEN36_SDPA_STREAMING=1",
        "--rm",  # oci-containers' autoRemoveOnStop default
        "--pull missing",
        "'--device=/dev/tenstorrent/0'",
        "'--volume=/dev/hugepages-1G:/dev/hugepages-1G'",
        "'--ipc=host'",
        "'--network=host'",
        "'--stop-timeout=60'",
        f"{IMAGE} \\\n  --model",
    ):
        assert word in start, word


def test_pre_start_loads_the_image_file_and_never_kills_a_leftover() -> None:
    scripts = _scripts_by_name(_config())
    pre = scripts["tenstorrent-serving-pre-start"]
    assert pre.startswith(
        "#!/bin/bash\nset -e\n\n"
        "echo 'tenstorrent-serving-config: prefix-caching=on digest=sha256:00'\n"
    )  # the module's banner first
    assert pre.rstrip().endswith(f"docker load -i {IMAGE_FILE}")
    running = "docker inspect --format '{{.State.Running}}' tenstorrent-serving"
    assert pre.index(running) < pre.index("docker stop -t 60 tenstorrent-serving")
    assert pre.index("docker stop -t 60") < pre.index("docker rm tenstorrent-serving")
    assert "rm -f" not in pre
    forced = _scripts_by_name(_config(graceful_pre_start=False))["tenstorrent-serving-pre-start"]
    assert "docker rm -f tenstorrent-serving || true" in forced  # oci-containers' own
    assert "docker stop" not in forced
    stop = scripts["tenstorrent-serving-pre-stop"]
    assert "docker stop -t 60 tenstorrent-serving || exit 0" in stop
    assert stop.index("docker stop") < stop.index('while kill -0 "${MAINPID:-}"')
    post = scripts["tenstorrent-serving-post-stop"]
    assert "docker rm tenstorrent-serving" in post
    assert "-f" not in post.split()


def test_unit_has_the_modules_order_path_and_timeouts() -> None:
    lines = _unit_lines(_config())
    pre = [line for line in lines if line.startswith("ExecStartPre=")]
    assert len(pre) == 1  # the module's preStart replaces oci-containers' pre-start
    assert pre[0].endswith("/bin/tenstorrent-serving-pre-start")
    assert "After=docker.service docker.socket tenstorrent-hugepages.service" in lines
    assert "Requires=tenstorrent-hugepages.service" in lines
    assert "RequiresMountsFor=/dev/hugepages-1G" in lines
    assert "TimeoutStopSec=90" in lines
    assert "TimeoutStartSec=0" in lines
    assert "Restart=on-failure" in lines
    assert f'Environment="PATH={toolpath.unit_path(("docker",))}"' in lines
    assert 'Environment="TZDIR=/usr/share/zoneinfo"' in lines  # systemd.globalEnvironment


def test_hugepage_units_follow_the_module() -> None:
    rendered = render_units(_config())
    mount = mount_unit_name("/dev/hugepages-1G")
    assert mount == "dev-hugepages\\x2d1G.mount"
    assert set(rendered.units) == {
        "tenstorrent-serving.service",
        "tenstorrent-hugepages.service",
        mount,
    }
    oneshot = rendered.units["tenstorrent-hugepages.service"]
    assert "WantedBy=sysinit.target" in oneshot
    assert f'Environment="PATH={toolpath.unit_path()}"' in oneshot  # systemd-lib defaults only
    script = next(t for p, t in rendered.scripts.items() if p.endswith("hugepages-start"))
    assert 'reserved $got of 2 1G hugepages" >&2' in script
    without = render_units(_config(hugepages=None))
    assert set(without.units) == {"tenstorrent-serving.service"}
    assert "--volume" not in "".join(without.scripts.values())


def test_scripts_are_content_addressed() -> None:
    one = render_units(_config())
    other = render_units(_config(args=("--model", "/models/other")))
    assert all(path.startswith(STORE_DIR + "/") for path in one.scripts)
    start = [p for p in one.scripts if p.endswith("-start") and "serving-start" in p]
    changed = [p for p in other.scripts if p.endswith("-start") and "serving-start" in p]
    assert start != changed  # a new command is a new path, as in the Nix store
    assert "ExecStart=" + start[0] + " " in _unit_lines(_config())


def test_script_command_is_the_argv_bash_runs(tmp_path: Path) -> None:
    """The check compares the live ``docker run`` argv with this: it must be exact."""
    start = _scripts_by_name(_config())["tenstorrent-serving-start"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text('#!/bin/sh\nfor a in docker "$@"; do printf "%s\\n" "$a"; done\n')
    (fake / "docker").chmod(0o755)
    (tmp_path / "start").write_text(start)
    if not Path("/bin/bash").exists():
        pytest.skip("bash is needed to run the rendered script")
    result = subprocess.run(
        ["/bin/bash", str(tmp_path / "start")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(fake)},
        check=True,
    )
    argv = result.stdout.splitlines()
    assert argv[:2] == ["docker", "run"]
    assert " ".join(argv) == script_command(start)
