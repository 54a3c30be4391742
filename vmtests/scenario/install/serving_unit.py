"""The serving units as NixOS renders them, for the reference guest.

``modules/tenstorrent-serving.nix`` declares ``virtualisation.oci-containers.containers.
tenstorrent-serving`` and adjusts its service; nixpkgs then renders it. The reference guest
installs the units of the full NixOS evaluation where one runs (``nixos_units``); this module
renders the same units from the same inputs, following the nixpkgs sources line by line, for the
negative controls (which alter a configuration) and for hosts without a nixpkgs tree.
``nixos_units.differences`` proves the two identical for every VM configuration
(``tests/eval/test_eval_nixos_units.py``, and again before a guest installs them):

- ``nixos/modules/virtualisation/oci-containers.nix`` (``mkService``): the ``script``
  ``exec docker run --name=<name> --log-driver=<driver> -e K=V ... --env-file F --rm --pull
  missing <extraOptions> <image> <cmd>``; ``path = [ docker ]``; ``After=docker.service
  docker.socket``; ``Restart=on-failure``, ``TimeoutStartSec=0``;
- ``nixos/lib/systemd-lib.nix`` (``makeJobScript``): every ``preStart``/``script``/
  ``preStop``/``postStop`` becomes ``writeShellScriptBin`` of ``set -e`` and the text,
  referenced from ``ExecStartPre``/``ExecStart``/``ExecStop``/``ExecStopPost``; ``PATH`` is the
  unit's ``path`` plus coreutils, findutils, gnugrep, gnused and systemd, ``bin`` then ``sbin``
  (``stage2ServiceConfig``); every service also gets ``systemd.globalEnvironment``:
  ``TZDIR`` (``nixos/modules/config/locale.nix``, always) and ``LOCALE_ARCHIVE``
  (``nixos/modules/config/i18n.nix``, when locales are configured, as in every configuration
  here), written at Debian's paths. Debian's glibc ignores ``LOCALE_ARCHIVE`` (only nixpkgs'
  glibc reads it) and the guest has no locales package: the line is there to be the same unit;
- the module itself: one ``ExecStartPre`` (its ``preStart`` job script: the banner, a graceful
  ``docker stop -t <stopTimeout>`` of a running leftover, a plain ``docker rm``, ``docker load
  -i <imageFile>`` unless Docker holds the image from the file's last load) replacing
  oci-containers' ``pre-start`` with its ``docker rm -f`` and its load at every start;
  ``docker stop -t <stopTimeout>`` then a wait for ``$MAINPID`` as ``preStop``, a ``postStop``
  that ends at once when ``--rm`` removed the container and otherwise stops gracefully before a
  plain ``docker rm``, ``TimeoutStopSec = stopTimeout + 30``, the
  device/hugepage/ipc/network options, ``--stop-timeout=<stopTimeout>``, the hugepage oneshot
  and its hugetlbfs mount.

Store paths become files under ``STORE_DIR`` named by a hash of their content (a changed
script is a new path, as in the Nix store), and packages become the tool directories of
``vmtests.guest.toolpath``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vmtests.contracts.serving import (
    DEVICE,
    HUGEPAGES_UNIT,
    SERVING_CONTAINER,
    SERVING_UNIT,
    Hugepages,
)
from vmtests.guest import toolpath
from vmtests.nixos_eval import job_script_file
from vmtests.stub import knobs

STORE_DIR = "/usr/lib/vmtests/store"
"""Where the reference guest keeps what NixOS keeps in the store: scripts and the image file."""

BACKEND = "docker"
RUNTIME_SHELL = "/bin/bash"
STOP_TIMEOUT_MARGIN = 30
GLOBAL_ENVIRONMENT = {
    # systemd.globalEnvironment at the Debian paths of the same trees (glibc-locales, tzdata).
    "LOCALE_ARCHIVE": "/usr/lib/locale/locale-archive",
    "TZDIR": "/usr/share/zoneinfo",
}
RUNNING_FORMAT = "'{{.State.Running}}'"
"""``docker container inspect --format`` of whether a container runs (pre-start, post-stop)."""
WAIT_FOR_MAIN_PROCESS = 'while kill -0 "${MAINPID:-}" 2>/dev/null; do sleep 0.2; done'
"""The module's ExecStop waits for the attached client to exit on its own after the stop
(``waitForMainProcess`` in modules/tenstorrent-serving.nix)."""
_SAFE_ARG = re.compile(r"[a-zA-Z0-9,._+:@%/-]+")


def escape_shell_arg(arg: str) -> str:
    """nixpkgs ``lib.escapeShellArg``: unchanged when safe, else single-quoted."""
    if _SAFE_ARG.fullmatch(arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"


def store_path(name: str, content: str) -> str:
    """A content-addressed path under ``STORE_DIR`` (like a store path: new content, new path)."""
    digest = hashlib.sha256(f"{name}\0{content}".encode()).hexdigest()[:32]
    return f"{STORE_DIR}/{digest}-{name}"


@dataclass(frozen=True)
class OciContainer:
    """The options of ``virtualisation.oci-containers.containers.<name>`` the module sets."""

    name: str
    image: str
    image_file: str | None
    cmd: tuple[str, ...]
    environment: Mapping[str, str]
    extra_options: tuple[str, ...]
    environment_files: tuple[str, ...] = ()
    log_driver: str = "journald"
    auto_remove_on_stop: bool = True
    pull: str = "missing"


@dataclass(frozen=True)
class ServiceAdjustments:
    """What the module adds to the container's service (``systemd.services.<name>``)."""

    banner: str
    stop_timeout: int
    hugepages: Hugepages | None
    graceful_pre_start: bool = True
    """False renders oci-containers.nix's own pre-start (``docker rm -f``): a negative control."""


@dataclass
class RenderedUnits:
    """Files to install: unit files (``/etc/systemd/system``) and store files (scripts)."""

    units: dict[str, str] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)

    @property
    def script_paths(self) -> list[str]:
        """Paths of the scripts (store files that must be executable)."""
        return sorted(self.scripts)


def mount_unit_name(where: str) -> str:
    """systemd's unit name of a mount point (``systemd-escape --path --suffix=mount``)."""
    escaped = "".join(
        char if char.isalnum() or char in "_." else f"\\x{ord(char):02x}"
        for char in where.strip("/")
    )
    return escaped.replace("\\x2f", "-") + ".mount"


def oci_container(
    *,
    image: str,
    image_file: str | None,
    args: tuple[str, ...],
    environment: Mapping[str, str],
    stop_timeout: int,
    hugepages: Hugepages | None,
    devices: tuple[str, ...] = (DEVICE,),
    extra_options: tuple[str, ...] = (),
    environment_files: tuple[str, ...] = (),
) -> OciContainer:
    """The module's container from the Nix core's output (``modules/tenstorrent-serving.nix``)
    and the host's ``extraOptions``; ``vmtests.scenario.install.nixos_units.differences`` holds
    it to the evaluated ``virtualisation.oci-containers.containers.tenstorrent-serving``."""
    options = [f"--device={device}" for device in devices]
    if hugepages:
        mount = hugepages.mount_point
        options.append(f"--volume={mount}:{mount}")
    options += ["--ipc=host", "--network=host", f"--stop-timeout={stop_timeout}"]
    return OciContainer(
        name=SERVING_CONTAINER,
        image=image,
        image_file=image_file,
        cmd=tuple(args),
        environment=dict(environment),
        extra_options=(*options, *extra_options),
        # The stub device layer's knobs (modules/tenstorrent-stub.nix adds the same file).
        environment_files=(knobs.KNOBS_FILE, *environment_files),
    )


def job_script_text(text: str) -> str:
    """The file ``makeJobScript`` (systemd-lib.nix) writes, with bash as its interpreter."""
    return job_script_file(text, RUNTIME_SHELL)


def job_script(name: str, text: str) -> tuple[str, str]:
    """``makeJobScript``: the script's path (``<store>/bin/<name>``) and its file text."""
    content = job_script_text(text)
    return f"{store_path(f'unit-script-{name}', content)}/bin/{name}", content


def pre_start_text(
    container: OciContainer, banner: str, stop_timeout: int, graceful: bool = True
) -> str:
    """The module's ``preStart``: the banner, a leftover container stopped, the image loaded.

    oci-containers.nix runs ``docker rm -f <name>`` and loads the image file at every start
    instead (``graceful=False`` renders exactly that); ``rm -f`` SIGKILLs a running leftover.
    The module stops a running leftover with the graceful timeout first and removes it only
    once it has stopped (a plain ``docker rm`` refuses a running container), and loads the
    image file only when Docker does not hold the image it gave at its last load.
    """
    name = escape_shell_arg(container.name)
    lines = [f"echo {escape_shell_arg(banner)}"]
    if graceful:
        lines += [
            f"state=$({BACKEND} container inspect --format {RUNNING_FORMAT} {name} 2>/dev/null)"
            " || state=none",
            'if [ "$state" = true ]; then',
            f'  echo "stopping the leftover container {container.name} gracefully '
            f'({BACKEND} stop -t {stop_timeout})"',
            "  # It may end by itself (and --rm remove it) between the inspect and the stop.",
            f'  {BACKEND} stop -t {stop_timeout} {name} || {{ [ "$({BACKEND} container inspect '
            f'--format {RUNNING_FORMAT} {name} 2>/dev/null)" != true ]; '
            f'echo "the leftover container {container.name} had already ended"; }}',
            "fi",
            "# Only a stopped container is left here. With --rm, Docker may still be removing it",
            "# after the stop returned: wait (50 looks at most) until its name is free.",
            'if [ "$state" != none ]; then',
            f"  {BACKEND} rm {name} >/dev/null 2>&1 || true",
            f"  for _ in $(seq 50); do {BACKEND} container inspect {name} >/dev/null 2>&1"
            " || break; sleep 0.2; done",
            "fi",
        ]
        if container.image_file is not None:
            lines += _load_image_lines(container)
    else:
        lines.append(f"{BACKEND} rm -f {name} || true")
        if container.image_file is not None:
            lines.append(f"{BACKEND} load -i {container.image_file}")
    return "\n".join(lines) + "\n"


def _load_image_lines(container: OciContainer) -> list[str]:
    """The module's ``loadImage``: ``docker load`` only when the stamp does not match."""
    image = escape_shell_arg(container.image)
    image_id = f"{BACKEND} image inspect --format '{{{{.Id}}}}' {image}"
    # "<image file> <image ID>" of the last load, under /run: every boot loads once.
    stamp_dir, image_file = f"/run/{container.name}", container.image_file
    stamp = f"{stamp_dir}/loaded-image"
    return [
        f'if [ "$(cat {stamp} 2>/dev/null)" != "{image_file} $({image_id} 2>/dev/null)" ]; then',
        f"  {BACKEND} load -i {image_file}",
        f"  if id=$({image_id}); then",
        f"    mkdir -p {stamp_dir}",
        f'    echo "{image_file} $id" > {stamp}',
        "  fi",
        "fi",
    ]


def run_script_text(container: OciContainer) -> str:
    """oci-containers.nix ``script``: ``exec docker run ...`` joined with `` \\\\\\n  ``."""
    words = [f"exec {BACKEND} ", "run", f"--name={escape_shell_arg(container.name)}"]
    words.append(f"--log-driver={container.log_driver}")
    words += [
        f"-e {escape_shell_arg(key)}={escape_shell_arg(value)}"
        for key, value in sorted(container.environment.items())
    ]
    words += [f"--env-file {escape_shell_arg(path)}" for path in container.environment_files]
    if container.auto_remove_on_stop:
        words.append("--rm")
    words.append(f"--pull {escape_shell_arg(container.pull)}")
    words += [escape_shell_arg(option) for option in container.extra_options]
    words.append(container.image)
    words += [escape_shell_arg(arg) for arg in container.cmd]
    return " \\\n  ".join(words)


def _systemd_value(word: str) -> str:
    """Quote one ``Environment=`` assignment as NixOS does (``"K=V"``)."""
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def environment_lines(packages: tuple[str, ...] = ()) -> list[str]:
    """A service's ``Environment=`` lines: the global environment and its PATH, sorted."""
    environment = {**GLOBAL_ENVIRONMENT, "PATH": toolpath.unit_path(packages)}
    return [f"Environment={_systemd_value(f'{k}={v}')}" for k, v in sorted(environment.items())]


def render_container_service(
    container: OciContainer, adjustments: ServiceAdjustments
) -> RenderedUnits:
    """The serving unit and its scripts, as oci-containers.nix plus the module render them."""
    rendered = RenderedUnits()
    name, stop = container.name, adjustments.stop_timeout
    pre_text = pre_start_text(container, adjustments.banner, stop, adjustments.graceful_pre_start)
    pre_path, pre = job_script(f"{name}-pre-start", pre_text)
    start_path, start = job_script(f"{name}-start", run_script_text(container))
    stop_path, stop_script = job_script(
        f"{name}-pre-stop", f"{BACKEND} stop -t {stop} {name} || exit 0\n{WAIT_FOR_MAIN_PROCESS}\n"
    )
    post_path, post = job_script(
        f"{name}-post-stop",
        f"state=$({BACKEND} container inspect --format {RUNNING_FORMAT} {name}"
        " 2>/dev/null) || exit 0\n"
        f'if [ "$state" = true ]; then {BACKEND} stop -t {stop} {name} >/dev/null 2>&1'
        " || true; fi\n"
        f"{BACKEND} rm {name} >/dev/null 2>&1 || true\n",
    )
    for path, text in (
        (pre_path, pre),
        (start_path, start),
        (stop_path, stop_script),
        (post_path, post),
    ):
        rendered.scripts[path] = text
    hugepages = adjustments.hugepages
    after = [f"{BACKEND}.service", f"{BACKEND}.socket"]
    requires: list[str] = []
    if hugepages:
        after.append(HUGEPAGES_UNIT)
        requires.append(HUGEPAGES_UNIT)
    lines = [
        "[Unit]",
        f"After={' '.join(after)}",
        *([f"Requires={' '.join(requires)}"] if requires else []),
        *([f"RequiresMountsFor={hugepages.mount_point}"] if hugepages else []),
        "",
        "[Service]",
        *environment_lines((BACKEND,)),
        f"ExecStart={start_path} ",
        f"ExecStartPre={pre_path}",
        f"ExecStop={stop_path}",
        f"ExecStopPost={post_path}",
        "Restart=on-failure",
        "TimeoutStartSec=0",
        f"TimeoutStopSec={stop + STOP_TIMEOUT_MARGIN}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    rendered.units[SERVING_UNIT] = "\n".join(lines)
    if hugepages:
        render_hugepage_units(hugepages, rendered)
    return rendered


def hugepage_script_text(hugepages: Hugepages) -> str:
    """The module's ``tenstorrent-hugepages`` script (fails when fewer pages are reserved)."""
    count, size, kib = hugepages.count, hugepages.size, hugepages.size_kib
    return (
        f"pool=/sys/kernel/mm/hugepages/hugepages-{kib}kB\n"
        'if [ ! -d "$pool" ]; then\n'
        f'  echo "$pool is missing: this CPU/kernel offers no {size} pages" >&2\n'
        "  exit 1\n"
        "fi\n"
        "# A 1 GiB page needs a free, aligned region, which a running system's memory seldom\n"
        "# has: while pages are missing, free the page cache and compact memory (kernel\n"
        "# Documentation/admin-guide/sysctl/vm.rst) before each of three tries. At boot little is\n"
        "# cached yet; a pool that holds enough pages drops no cache (it is set to the count).\n"
        "for _ in 1 2 3; do\n"
        f'  if [ "$(cat "$pool/nr_hugepages")" -lt {count} ]; then\n'
        "    sync\n"
        "    # Only an aid: a read-only /proc/sys must not end the tries (the check decides).\n"
        "    echo 3 > /proc/sys/vm/drop_caches || true\n"
        "    if [ -e /proc/sys/vm/compact_memory ]; then"
        " echo 1 > /proc/sys/vm/compact_memory || true; fi\n"
        "  fi\n"
        f'  if ! echo {count} > "$pool/nr_hugepages"; then\n'
        '    echo "cannot write $pool/nr_hugepages" >&2\n'
        "    exit 1\n"
        "  fi\n"
        '  got=$(cat "$pool/nr_hugepages")\n'
        f'  if [ "${{got:-0}}" -eq {count} ]; then break; fi\n'
        "done\n"
        f'if [ "${{got:-0}}" -ne {count} ]; then\n'
        f'  echo "reserved ${{got:-0}} of {count} {size} hugepages" >&2\n'
        "  exit 1\n"
        "fi\n"
        f'echo "reserved {count} x {size} hugepages"\n'
    )


def render_hugepage_units(hugepages: Hugepages, rendered: RenderedUnits) -> None:
    """The boot-time oneshot and the hugetlbfs mount the module declares."""
    count, size = hugepages.count, hugepages.size
    path, script = job_script(
        f"{HUGEPAGES_UNIT.removesuffix('.service')}-start", hugepage_script_text(hugepages)
    )
    rendered.scripts[path] = script
    rendered.units[HUGEPAGES_UNIT] = "\n".join(
        [
            "[Unit]",
            "After=systemd-sysctl.service",
            "Before=sysinit.target shutdown.target",
            "Conflicts=shutdown.target",
            "DefaultDependencies=false",
            f"Description=Reserve {count} x {size} hugepages for {SERVING_CONTAINER}",
            "",
            "[Service]",
            *environment_lines(),
            f"ExecStart={path} ",
            "RemainAfterExit=true",
            "Type=oneshot",
            "",
            "[Install]",
            "WantedBy=sysinit.target",
            "",
        ]
    )
    where = hugepages.mount_point
    rendered.units[mount_unit_name(where)] = "\n".join(
        [
            "[Unit]",
            f"After={HUGEPAGES_UNIT}",
            "Before=sysinit.target",
            "DefaultDependencies=false",
            f"Description=hugetlbfs with {size} pages for {SERVING_CONTAINER}",
            "",
            "[Mount]",
            f"Options=pagesize={size}",
            "Type=hugetlbfs",
            "What=hugetlbfs",
            f"Where={where}",
            "",
            "",
            "[Install]",
            "WantedBy=sysinit.target",
            "",
        ]
    )
