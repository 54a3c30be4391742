"""What a unit's start script runs as a container: its ``docker run`` / ``podman run`` words.

On NixOS an oci-containers service's ExecStart is a job script (nixpkgs
``nixos/modules/virtualisation/oci-containers.nix``, ``mkService``'s ``script``): a single
``exec docker run ...`` command whose words are joined by backslash-newline continuations and
quoted with ``escapeShellArg``: the ``preRunExtraOptions`` before ``run``, then ``--name=``,
``-e K=V`` per environment variable, the other options, the image (unquoted) and the container's
``cmd``. ``nixos/lib/systemd-lib.nix`` ``makeJobScript`` writes it after a shebang and
``set -e``. ``parse_container_run`` reads that script (or a plain ``docker run`` command line)
back into the image, the ``-e``/``--env`` assignments and the arguments after the image.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

BACKENDS = frozenset({"docker", "podman"})
# `docker run` options that take their value as the next word (docker-run(1), `docker run
# --help` of Docker 28; podman-run(1) for --cgroups, --sdnotify). Any other option is a flag,
# so an unlisted `--opt value` would end the options early: keep this list complete.
_LONG_VALUE_OPTION_NAMES = (
    "--add-host --annotation --attach --blkio-weight --blkio-weight-device --cap-add "
    "--cap-drop --cgroup-parent --cgroupns --cgroups --cidfile --cpu-period --cpu-quota "
    "--cpu-rt-period --cpu-rt-runtime --cpu-shares --cpus --cpuset-cpus --cpuset-mems "
    "--device --device-cgroup-rule --device-read-bps --device-read-iops --device-write-bps "
    "--device-write-iops --dns --dns-option --dns-search --domainname --entrypoint --env "
    "--env-file --expose --gpus --group-add --health-cmd --health-interval --health-retries "
    "--health-start-interval --health-start-period --health-timeout --hostname --ip --ip6 "
    "--ipc --isolation --kernel-memory --label --label-file --link --link-local-ip "
    "--log-driver --log-opt --mac-address --memory --memory-reservation --memory-swap "
    "--memory-swappiness --mount --name --network --network-alias --oom-score-adj --pid "
    "--pids-limit --platform --publish --pull --restart --runtime --sdnotify --security-opt "
    "--shm-size --stop-signal --stop-timeout --storage-opt --sysctl --tmpfs --ulimit --user "
    "--userns --uts --volume --volume-driver --volumes-from --workdir"
)
_LONG_VALUE_OPTIONS = frozenset(_LONG_VALUE_OPTION_NAMES.split())
_SHORT_VALUE_OPTIONS = frozenset("acehlmpuvw")  # -a -c -e -h -l -m -p -u -v -w


@dataclass(frozen=True)
class ContainerRun:
    """One ``docker run`` / ``podman run``: ``environment`` holds its ``-e K=V`` assignments
    (``-e K`` without a value and ``--env-file`` are not read), ``args`` what follows the
    image (appended to the image's entrypoint)."""

    backend: str
    image: str
    environment: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


def parse_container_run(script: str) -> ContainerRun | None:
    """The first ``docker run`` or ``podman run`` of ``script``; None when it runs neither.

    ``ValueError`` when a line cannot be split as shell words (an unterminated quote).
    """
    for line in script.replace("\\\n", "").splitlines():
        words = shlex.split(line, comments=True)
        for index, word in enumerate(words):
            backend = word.rsplit("/", 1)[-1]
            if backend in BACKENDS and "run" in words[index + 1 :]:
                start = words.index("run", index + 1) + 1
                return _run(backend, words[start:])
    return None


def _run(backend: str, words: list[str]) -> ContainerRun | None:
    """Options, image and arguments of the words after ``run``."""
    environment: dict[str, str] = {}
    index = 0
    while index < len(words) and words[index].startswith("-") and words[index] != "-":
        word = words[index]
        index += 1
        if word == "--":
            break
        name, value = _option(word)
        if value is None and (name in _LONG_VALUE_OPTIONS or name[1:] in _SHORT_VALUE_OPTIONS):
            value = words[index] if index < len(words) else ""
            index += 1
        if name in {"-e", "--env"} and value and "=" in value:
            key, _, text = value.partition("=")
            environment[key] = text
    if index >= len(words):
        return None
    return ContainerRun(backend, words[index], environment, words[index + 1 :])


def _option(word: str) -> tuple[str, str | None]:
    """(name, attached value or None): ``--name=x``, ``--rm``, ``-eK=V``, ``-e``, ``-it``."""
    if word.startswith("--"):
        name, equals, value = word.partition("=")
        return name, value if equals else None
    # Short options cluster (getopt): the first one that takes a value takes the rest.
    for position, letter in enumerate(word[1:], start=1):
        if letter in _SHORT_VALUE_OPTIONS:
            rest = word[position + 1 :]
            return f"-{letter}", rest or None
    return word, None
