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

from vmtests.contracts.serving import Hugepages
from vmtests.guest import toolpath
from vmtests.guest.stub_image import IMAGE
from vmtests.scenario.install.reference_switch import ServingConfig, render_units
from vmtests.scenario.install.serving_unit import (
    STORE_DIR,
    escape_shell_arg,
    mount_unit_name,
)
from vmtests.scenario.judgement.sources import script_command

IMAGE_FILE = f"{STORE_DIR}/0123-vmtests-stub-vllm.tar.gz"
HUGEPAGES = Hugepages(2, "1G")


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
    assert f"  docker load -i {IMAGE_FILE}\n" in pre
    running = "docker container inspect --format '{{.State.Running}}' tenstorrent-serving"
    assert pre.index(running) < pre.index("docker stop -t 60 tenstorrent-serving")
    assert pre.index("docker stop -t 60") < pre.index("docker rm tenstorrent-serving")
    assert pre.index("docker rm tenstorrent-serving") < pre.index("docker load")
    assert "rm -f" not in pre
    forced = _scripts_by_name(_config(graceful_pre_start=False))["tenstorrent-serving-pre-start"]
    assert "docker rm -f tenstorrent-serving || true" in forced  # oci-containers' own
    assert forced.rstrip().endswith(f"docker load -i {IMAGE_FILE}")  # at every start
    assert "docker stop" not in forced
    stop = scripts["tenstorrent-serving-pre-stop"]
    assert "docker stop -t 60 tenstorrent-serving || exit 0" in stop
    assert stop.index("docker stop") < stop.index('while kill -0 "${MAINPID:-}"')
    post = scripts["tenstorrent-serving-post-stop"]
    assert "docker rm tenstorrent-serving" in post
    assert "-f" not in post.split()


# A `docker` that logs its arguments and answers like Docker: a container of that name only while
# $RUNNING_FILE holds its state (a stop leaves it stopped, $STOP_FAILS makes the stop fail, rm
# removes a stopped one), and an image (its ID in $IMAGE_ID_FILE) once `docker load` has run.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$DOCKER_LOG"
case "$1 $2" in
  "container inspect") [ -f "$RUNNING_FILE" ] && { cat "$RUNNING_FILE"; exit 0; }
    echo "Error: No such container: $5" >&2; exit 1 ;;
  "image inspect") [ -f "$IMAGE_ID_FILE" ] && { cat "$IMAGE_ID_FILE"; exit 0; }
    echo "Error: No such image: $5" >&2; exit 1 ;;
  "load -i") [ -n "$LOAD_AS_OTHER_TAG" ] || echo sha256:1d2e > "$IMAGE_ID_FILE"
    echo "Loaded image: $3" ;;
  "stop -t") case "$STOP_FAILS" in
      gone) rm -f "$RUNNING_FILE"; echo "Error: No such container: $4" >&2; exit 1 ;;
      stopped) echo false > "$RUNNING_FILE"; echo "Error: stopping container $4" >&2; exit 1 ;;
      running) echo "Error: cannot stop container: $4" >&2; exit 1 ;;
    esac
    [ -f "$RUNNING_FILE" ] && echo false > "$RUNNING_FILE"; echo "$4" ;;
  "rm "*) grep -qx true "$RUNNING_FILE" 2>/dev/null \
      && { echo "Error: cannot remove a running container" >&2; exit 1; }
    rm -f "$RUNNING_FILE" ;;
esac
"""


class FakeDocker:
    """Runs the rendered scripts with ``FAKE_DOCKER`` first on the PATH and the load stamp moved
    from /run into ``tmp_path``; ``calls`` is what the scripts asked of Docker."""

    def __init__(self, tmp_path: Path) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "docker").write_text(FAKE_DOCKER)
        (bin_dir / "docker").chmod(0o755)
        self.tmp_path = tmp_path
        self.image_id_file = tmp_path / "image-id"
        self.running_file = tmp_path / "running"
        self.log = tmp_path / "docker.log"
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "DOCKER_LOG": str(self.log),
            "IMAGE_ID_FILE": str(self.image_id_file),
            "RUNNING_FILE": str(self.running_file),
        }

    def run(self, script: str) -> list[str]:
        """Run one script; the Docker calls it made."""
        done = self.attempt(script)
        assert done.returncode == 0, done.stderr
        return self.log.read_text().splitlines()

    def attempt(self, script: str) -> subprocess.CompletedProcess[str]:
        """Run one script as its unit's ``set -e`` shell does, whatever its exit status."""
        self.log.write_text("")
        text = script.replace("/run/tenstorrent-serving", str(self.tmp_path / "run"))
        return subprocess.run(
            ["bash", "-c", text], env=self.env, capture_output=True, text=True, check=False
        )


def test_pre_start_loads_the_image_file_only_when_docker_lacks_it(tmp_path: Path) -> None:
    docker = FakeDocker(tmp_path)
    pre = _scripts_by_name(_config())["tenstorrent-serving-pre-start"]
    loads = [f"load -i {IMAGE_FILE}"]

    def loaded(calls: list[str]) -> list[str]:
        return [call for call in calls if call.startswith("load")]

    assert loaded(docker.run(pre)) == loads  # first start of the boot: no stamp
    stamp = (tmp_path / "run/loaded-image").read_text()
    assert stamp == f"{IMAGE_FILE} sha256:1d2e\n"
    calls = docker.run(pre)
    assert loaded(calls) == []  # same file, image still held: no load
    assert len(calls) == 2, calls  # one container inspect, one image inspect
    docker.image_id_file.unlink()  # `docker rmi`: the image is gone
    assert loaded(docker.run(pre)) == loads
    docker.image_id_file.write_text("sha256:9f8e\n")  # the tag now names another image
    assert loaded(docker.run(pre)) == loads
    other_file = pre.replace(IMAGE_FILE, f"{STORE_DIR}/4567-vmtests-stub-vllm.tar.gz")
    assert loaded(docker.run(other_file)) == [f"load -i {STORE_DIR}/4567-vmtests-stub-vllm.tar.gz"]


def test_a_file_that_loads_under_another_tag_is_loaded_at_every_start(tmp_path: Path) -> None:
    docker = FakeDocker(tmp_path)
    docker.env["LOAD_AS_OTHER_TAG"] = "1"  # `docker load` works, but not as the unit's image
    pre = _scripts_by_name(_config())["tenstorrent-serving-pre-start"]
    for _ in range(2):  # no stamp is written without an image ID, so nothing is skipped
        assert [call for call in docker.run(pre) if call.startswith("load")] == [
            f"load -i {IMAGE_FILE}"
        ]
        assert not (tmp_path / "run/loaded-image").exists()


def test_leftover_and_post_stop_ask_docker_once_when_no_container_is_left(
    tmp_path: Path,
) -> None:
    docker = FakeDocker(tmp_path)
    scripts = _scripts_by_name(_config())
    post = scripts["tenstorrent-serving-post-stop"]
    assert docker.run(post) == ["container inspect --format {{.State.Running}} tenstorrent-serving"]
    docker.running_file.write_text("true\n")  # the container outlived `docker run`
    assert docker.run(post)[1:] == [
        "stop -t 60 tenstorrent-serving",
        "rm tenstorrent-serving",
    ]
    docker.running_file.write_text("true\n")  # a leftover of a crashed unit, still running
    calls = docker.run(scripts["tenstorrent-serving-pre-start"])
    inspect = "container inspect tenstorrent-serving"
    assert calls[1:4] == ["stop -t 60 tenstorrent-serving", "rm tenstorrent-serving", inspect]
    docker.running_file.write_text("false\n")  # stopped, not removed: removed, not stopped
    calls = docker.run(scripts["tenstorrent-serving-pre-start"])
    assert calls[1:3] == ["rm tenstorrent-serving", inspect]  # its name is free at once
    assert not [call for call in calls if call.startswith("stop")]


def test_a_leftover_that_ends_during_the_pre_start_does_not_fail_the_start(
    tmp_path: Path,
) -> None:
    """The leftover runs at the inspect and has ended (and ``--rm`` removed it, or not yet) at
    the stop: the start goes on and says so. A stop that fails while the leftover still runs
    fails the start (``set -e``)."""
    docker = FakeDocker(tmp_path)
    pre = _scripts_by_name(_config())["tenstorrent-serving-pre-start"]
    assert pre.startswith("#!/bin/bash\nset -e\n")
    running = "container inspect --format {{.State.Running}} tenstorrent-serving"
    for how in ("gone", "stopped"):
        docker.running_file.write_text("true\n")
        docker.env["STOP_FAILS"] = how
        done = docker.attempt(pre)
        assert done.returncode == 0, done.stderr
        assert "the leftover container tenstorrent-serving had already ended" in done.stdout
        calls = docker.log.read_text().splitlines()
        assert calls[1:3] == ["stop -t 60 tenstorrent-serving", running]
        assert calls[-1] == "image inspect --format {{.Id}} vmtests-stub-vllm:latest"
    docker.running_file.write_text("true\n")
    docker.env["STOP_FAILS"] = "running"
    failed = docker.attempt(pre)
    assert failed.returncode != 0
    assert "cannot stop container" in failed.stderr
    assert not [call for call in docker.log.read_text().splitlines() if call.startswith("load")]


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
    assert 'reserved ${got:-0} of 2 1G hugepages" >&2' in script
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
