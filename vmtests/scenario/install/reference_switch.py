"""The documented install ("switch") step of the reference guest.

The reference guest is Debian, not NixOS, so ``nixos-rebuild switch`` cannot run there. Instead
this step does what the module's switch would do, from the very same Nix core:

1. evaluate ``modules/serving/core.nix`` for the profile's serving profile with
   ``nix-instantiate`` on the HOST (``vmtests.nixcore.evaluate_core``);
2. render the units and scripts NixOS renders for the module: the container service of
   ``virtualisation.oci-containers`` (``docker load -i`` of the image file, ``exec docker run``
   with the core's args and environment, graceful stop), the hugepage oneshot and its mount
   (``vmtests.scenario.install.serving_unit``, which follows the nixpkgs sources);
3. copy the stub image archive (``vmtests.guest.stub_image``, built on the host) to the guest
   as its ``imageFile``;
4. write everything, ``daemon-reload``, enable, restart (like switch-to-configuration
   restarting changed units), and wait until ``/health`` answers.

The base state S0 is the same install for ``hosts/profiles/baseline.nix``: the serving unit as
production had it before the change, without the validated features.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from vmtests import nixos_eval
from vmtests.contracts.instrumentation import GUEST_MEMORY_MB, SSH_PORT
from vmtests.contracts.serving import (
    HUGEPAGE_SIZES_KIB,
    HUGEPAGES_UNIT,
    SERVING_PORT,
    SERVING_UNIT,
    Hugepages,
    hugepages_path,
)
from vmtests.contracts.settings import Settings, settings
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest import firewall
from vmtests.guest.resources import check_hugepages_fit
from vmtests.guest.stub_image import ARCHIVE_NAME, DISK_SERIAL, IMAGE, StubImage, stub_image
from vmtests.guest.stub_layer import TT_SMI_PATH, install_stub_device_layer
from vmtests.nixcore import CoreOutput, evaluate_core
from vmtests.nixrun import NixError
from vmtests.profiles import Profile
from vmtests.scenario.install import nixos_units
from vmtests.scenario.install.generations import DryRun, Generation, record_unit_set
from vmtests.scenario.install.serving_unit import (
    OciContainer,
    RenderedUnits,
    ServiceAdjustments,
    mount_unit_name,
    oci_container,
    render_container_service,
    store_path,
)
from vmtests.scenario.install.switching import wait_ready

UNIT_DIR = "/etc/systemd/system"
UNIT_RESTART_TIMEOUT = 360.0
"""A restart of the container unit: a graceful stop, ``docker load`` of the image file and the
start; under TCG on a loaded two-core host it took up to several minutes (docs/ci-time.md)."""


@dataclass(frozen=True)
class ServingConfig:
    """What the reference guest's units run: the core's output, possibly altered by a control."""

    args: tuple[str, ...]
    environment: Mapping[str, str]
    banner: str
    hugepages: Hugepages | None
    stop_timeout: int
    image: str = IMAGE
    image_file: str | None = None
    graceful_pre_start: bool = True
    environment_files: tuple[str, ...] = ()
    """Extra ``docker run --env-file`` files (oci-containers ``environmentFiles``)."""
    extra_options: tuple[str, ...] = ()
    """The host's ``services.tenstorrent-serving.extraOptions`` (e.g. the model volume)."""
    firewall_tcp_ports: tuple[int, ...] | None = (SSH_PORT, SERVING_PORT)
    """The TCP ports the machine's firewall admits (``vmtests.guest.firewall``): the NixOS
    evaluation's ``networking.firewall.allowedTCPPorts``, None when it turns the firewall off.
    Without an evaluation: sshd's port (nixpkgs ``sshd.nix`` opens it) and the serving port,
    which hosts/vm-test/common.nix opens for the driver."""
    nixos: NixosRendering | None = field(default=None, compare=False, repr=False)
    """The units the full NixOS evaluation renders for exactly this configuration, if known.

    Not part of equality: a control that alters any field gets a configuration that no longer
    equals ``nixos.config``, and so the renderer's units for it (``render_units``)."""

    @classmethod
    def from_core(cls, core: CoreOutput) -> ServingConfig:
        """The configuration the Nix core computed; refuses one with failed assertions."""
        if core.failed_assertions:
            raise ValueError("the Nix core failed assertions: " + "; ".join(core.failed_assertions))
        config = cls(
            tuple(core.args), dict(core.environment), core.banner, core.hugepages, core.stop_timeout
        )
        return replace(config, firewall_tcp_ports=(SSH_PORT, config.port))

    @property
    def port(self) -> int:
        """The ``--port`` the server listens on."""
        args = list(self.args)
        if "--port" in args and args.index("--port") + 1 < len(args):
            return int(args[args.index("--port") + 1])
        return SERVING_PORT

    def without_env(self, *names: str) -> ServingConfig:
        """The same configuration without the environment variables ``names``."""
        return replace(
            self, environment={k: v for k, v in self.environment.items() if k not in names}
        )


@dataclass(frozen=True)
class NixosRendering:
    """A NixOS configuration's units, mapped onto the guest, and the configuration they are for."""

    configuration: str
    units: RenderedUnits
    config: ServingConfig


def systemd_quote(word: str) -> str:
    """Quote one word for a systemd ``Exec*=``/``Environment=`` line (no specifier expansion)."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%").replace("$", "$$") + '"'


def container_of(config: ServingConfig) -> OciContainer:
    """The module's container for ``config``."""
    return oci_container(
        image=config.image,
        image_file=config.image_file,
        args=config.args,
        environment=config.environment,
        stop_timeout=config.stop_timeout,
        hugepages=config.hugepages,
        environment_files=config.environment_files,
        extra_options=config.extra_options,
    )


def render_units(config: ServingConfig) -> RenderedUnits:
    """Every unit and script of ``config``: the NixOS evaluation's when it rendered exactly this
    configuration, else ``vmtests.scenario.install.serving_unit``'s."""
    if config.nixos is not None and config == config.nixos.config:
        return config.nixos.units
    return imitate_units(config)


def imitate_units(config: ServingConfig) -> RenderedUnits:
    """Every unit and script of ``config``, rendered as NixOS renders the module's."""
    container = container_of(config)
    adjustments = ServiceAdjustments(
        config.banner, config.stop_timeout, config.hugepages, config.graceful_pre_start
    )
    return render_container_service(container, adjustments)


def _reserve_now(hugepages: Hugepages) -> str:
    """Start the hugepage unit now unless it already holds the pages.

    Like switch-to-configuration, an unchanged, active hugepage unit is left alone (restarting
    it would restart the serving unit too, which requires it). The unit's own script frees the
    page cache and compacts memory before each of its tries while pages are missing, as it does
    on NixOS, and fails when fewer pages than asked are reserved.
    """
    mount = shlex.quote(mount_unit_name(hugepages.mount_point))
    pool = hugepages_path(hugepages.size_kib)
    return (
        f'if ! systemctl is-active -q {HUGEPAGES_UNIT} || [ "$(cat {pool})" -lt '
        f"{hugepages.count} ]; then systemctl restart {HUGEPAGES_UNIT}; fi; "
        f"systemctl is-active {HUGEPAGES_UNIT} && systemctl start {mount}"
    )


def write_rendered(
    machine: Machine, rendered: RenderedUnits, more: Mapping[str, str] | None = None
) -> None:
    """Write the rendered scripts (executable, in the store directory), unit files and the
    files ``more`` (path -> text).

    One command for all of them: under TCG every round trip costs a second or more.
    """
    files = {**rendered.scripts, **{f"{UNIT_DIR}/{name}": t for name, t in rendered.units.items()}}
    machine.write_files({**files, **(more or {})})
    if rendered.scripts:
        machine.succeed("chmod 0755 %s", list(rendered.script_paths))


ENABLE_UNITS = "systemctl enable --no-reload %s 2>&1"
"""Enable units without the reload ``enable`` makes itself (the caller reloads once)."""


InstallStage = Literal["written", "reloaded", "restarted", "ready"]
"""How far ``install_units`` goes: the units written; then enabled and systemd reloaded; then
the serving unit restarted; then it is active and ``/health`` answers."""


def install_units(machine: Machine, config: ServingConfig, until: InstallStage = "ready") -> None:
    """Write the units for ``config`` and go on as far as ``until`` says."""
    rendered = _write_units(machine, config)
    if until == "written":
        return
    # One reload (enable would reload again): under TCG each costs seconds. The firewall is
    # applied at once (firewall.APPLY).
    machine.succeed(
        f"{ENABLE_UNITS} && systemctl daemon-reload && {firewall.APPLY}",
        [*rendered.units, firewall.FIREWALL_UNIT],
    )
    if until in ("restarted", "ready"):
        restart_serving(machine, config)
    if until == "ready":
        wait_ready(machine, config.port)


def stage_units(machine: Machine, config: ServingConfig) -> None:
    """Write and enable the units for ``config`` without reloading systemd: for a caller that
    writes more files and then reloads once itself (each reload costs seconds under TCG)."""
    rendered = _write_units(machine, config)
    machine.succeed(ENABLE_UNITS, [*rendered.units, firewall.FIREWALL_UNIT])


def _write_units(machine: Machine, config: ServingConfig) -> RenderedUnits:
    """Write ``config``'s rendered units and its firewall; without hugepages, remove the
    hugepage units."""
    rendered = render_units(config)
    write_rendered(machine, rendered, firewall.firewall_files(config.firewall_tcp_ports))
    if not config.hugepages:
        mounts = [Hugepages(0, size).mount_point for size in HUGEPAGE_SIZES_KIB]
        names = [HUGEPAGES_UNIT, *map(mount_unit_name, mounts)]
        files = [f"{UNIT_DIR}/{name}" for name in names]
        machine.succeed("systemctl disable --now %s 2>/dev/null; rm -f %s; true", names, files)
    return rendered


def restart_serving(machine: Machine, config: ServingConfig) -> None:
    """Restart the serving unit of ``config`` (its hugepages reserved first, as at boot)."""
    if config.hugepages:
        machine.succeed(_reserve_now(config.hugepages), timeout=UNIT_RESTART_TIMEOUT)
    machine.succeed(f"systemctl restart {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)


def install_image_file(machine: Machine, image: StubImage) -> str:
    """Put the stub image archive into the guest's store directory; return its path there.

    The path is content-addressed like the ``imageFile`` store path on NixOS. A reference
    guest from ``machine_from_target`` carries the archive on a read-only disk; any other
    machine gets it copied over its command channel (slow under TCG). Either way the copy's
    sha256 must be the archive's.
    """
    path = store_path(image.archive.name, image.digest)
    tmp = f"{path}.tmp"
    disk = f"/dev/disk/by-id/virtio-{DISK_SERIAL}"
    if machine.execute("test -b %s", disk, timeout=30).rc == 0:
        machine.succeed(
            'mkdir -p "$(dirname %s)" && tar -x -O -f %s %s > %s && mv %s %s',
            path,
            disk,
            ARCHIVE_NAME,
            tmp,
            tmp,
            path,
            timeout=300,
        )
    else:
        machine.copy_to(image.archive, path, timeout=1800)
    digest = machine.succeed("sha256sum %s", path, timeout=120).split()[0]
    if digest != image.archive_sha256:
        raise DriverError(
            f"the stub image file {path} on {machine.name} has sha256 {digest}, expected "
            f"{image.archive_sha256} ({image.archive}): the disk carries another build"
        )
    return path


def units_source() -> tuple[str, str]:
    """Which units the reference guest installs, and why: ``("nixos", <where it evaluates>)``
    or ``("renderer", <why not NixOS>)``, from the ``units`` setting ($VMTESTS_UNITS)."""
    requested = settings().units
    if requested == "renderer":
        return "renderer", f"${Settings.variable('units')}=renderer"
    try:
        environment = nixos_eval.find_environment()
    except nixos_eval.NixosEvalUnavailable as error:
        if requested == "nixos":
            raise
        return "renderer", f"no full NixOS evaluation here: {error}"
    return "nixos", environment.describe()


def rendered_by_nixos(config: ServingConfig, serving_profile: str) -> ServingConfig:
    """``config`` carrying the units NixOS renders for ``serving_profile``'s VM configuration.

    The host's ``extraOptions`` come from the evaluation (the Nix core does not know them).
    Raises ``DriverError`` when ``vmtests.scenario.install.serving_unit`` renders anything else
    for the same configuration: the negative controls vary that renderer's units, so they would
    test another unit than NixOS's.
    """
    configuration = nixos_units.configuration_for(serving_profile)
    with log.nested(f"reading the units of {configuration} from the NixOS evaluation"):
        description = nixos_eval.describe(configuration)
        evaluated = description["firewall"]
        config = replace(
            config,
            extra_options=tuple(description["serving"]["extraOptions"]),
            firewall_tcp_ports=tuple(evaluated["allowedTCPPorts"]) if evaluated["enable"] else None,
        )
        units = nixos_units.rendered_units(configuration, config.image_file)
    mismatch = nixos_units.differences(imitate_units(config), units)
    if mismatch:
        raise DriverError(
            f"vmtests.scenario.install.serving_unit no longer renders what NixOS renders for "
            f"{configuration}; fix the renderer:\n" + "\n".join(mismatch)
        )
    return replace(config, nixos=NixosRendering(configuration, units, config))


def stub_image_path() -> str:
    """Where the stub image's file lies in a guest's store (``install_image_file``)."""
    image = stub_image()
    return store_path(image.archive.name, image.digest)


def image_file_on(machine: Machine) -> str:
    """The stub image's file in the guest's store, put there once (``install_image_file``)."""
    path = stub_image_path()
    if machine.execute("test -s %s", path, timeout=30).rc != 0:
        path = install_image_file(machine, stub_image())
    return path


class ReferenceSwitch:
    """The reference guest's switch (a ``Switcher``): the base is a serving profile (the
    baseline unless told otherwise), and ``switch`` installs any profile's units.

    ``restart=False`` installs, reloads and enables without restarting the serving unit: the
    certification restarts it itself, with the stop checked.
    """

    expected_system: str | None = None
    """Not a NixOS system: there is no toplevel to expect."""

    def __init__(
        self,
        profile: Profile,
        base_serving_profile: str = nixos_units.BASE_SERVING_PROFILE,
        *,
        restart: bool = True,
    ) -> None:
        self.profile = profile
        self.base_serving_profile = base_serving_profile
        self.restarts = restart
        self.units_source, why = units_source()
        if self.units_source == "nixos":
            configuration = nixos_units.configuration_for(profile.serving_profile)
            self.description = (
                f"reference install step: the units of {configuration} from the full NixOS "
                f"evaluation ({why}), store paths mapped onto the guest"
            )
        else:
            self.description = (
                "reference install step: units rendered by vmtests.scenario.install.serving_unit "
                f"from the Nix core for {profile.serving_profile} ({why})"
            )
        self._evaluated: dict[str, ServingConfig] = {}
        self._installed: dict[str, ServingConfig] = {}
        self._image_file: str | None = None

    def evaluated(self, serving_profile: str) -> ServingConfig:
        """What the Nix core computes for ``serving_profile`` (on the host, once)."""
        if serving_profile not in self._evaluated:
            with log.nested(f"evaluating the Nix core for {serving_profile}"):
                core = evaluate_core(profile_file=Path(serving_profile))
                self._evaluated[serving_profile] = ServingConfig.from_core(core)
        return self._evaluated[serving_profile]

    def configured(self, serving_profile: str) -> ServingConfig:
        """``serving_profile``'s configuration as a guest installs it, resolved on the host
        alone (once per profile): the stub image's file at its place in the guest's store, and
        NixOS's units when they are the source."""
        if serving_profile not in self._installed:
            self._installed[serving_profile] = self._rendered(serving_profile, stub_image_path())
        return self._installed[serving_profile]

    def configure(self) -> None:
        """Resolve base and target as a guest installs them, on the host alone
        (``configured``): what a prepared guest's snapshot key names before any guest runs."""
        self.configured(self.base_serving_profile)
        self.configured(self.profile.serving_profile)

    def installable(self, machine: Machine, serving_profile: str) -> ServingConfig:
        """``serving_profile``'s configuration as this guest installs it (``configured``), the
        stub image's file put on the guest first when it is not there yet."""
        self._image_file = self._image_file or image_file_on(machine)
        return self.configured(serving_profile)

    def _rendered(self, serving_profile: str, image_file: str) -> ServingConfig:
        """``serving_profile``'s configuration with ``image_file``, rendered as the guest
        installs it (NixOS's units when they are the source); changes nothing."""
        config = replace(self.evaluated(serving_profile), image=IMAGE, image_file=image_file)
        if self.units_source == "nixos":
            config = rendered_by_nixos(config, serving_profile)
        return config

    def _current(self, serving_profile: str) -> ServingConfig:
        return self._installed.get(serving_profile) or self.evaluated(serving_profile)

    @property
    def target(self) -> ServingConfig:
        """The profile's configuration (as a guest installs it, once ``configured``)."""
        return self._current(self.profile.serving_profile)

    @property
    def base(self) -> ServingConfig:
        """The base configuration (as a guest installs it, once ``configured``)."""
        return self._current(self.base_serving_profile)

    def prepare_base(self, machine: Machine) -> None:
        """Install the stub device layer, the image file and the base serving unit; start it.
        A machine that already serves the base configuration is left as it is.

        Refuses a profile whose hugepages do not fit in the guest's memory.
        """
        memory_mb = getattr(machine, "memory_mb", None) or GUEST_MEMORY_MB
        for config in (self.base, self.target):
            if config.hugepages:
                check_hugepages_fit(config.hugepages, memory_mb)
        if self._serves_base(machine):
            log.info(f"{machine.name} serves the base configuration already: nothing to deploy")
            self.configure()
            return
        self.install_base(machine)

    def install_base(self, machine: Machine) -> None:
        """Install the stub device layer, the image file and the base serving unit; start it."""
        with log.nested("installing the stub device layer"):
            install_stub_device_layer(machine)
        with log.nested(f"loading the stub image file into {machine.name}"):
            self._image_file = install_image_file(machine, stub_image())
        self.configure()
        with log.nested("installing the base serving unit"):
            install_units(machine, self.base)

    def _serves_base(self, machine: Machine) -> bool:
        """True when ``machine`` has the stub layer, the image file and the base's serving unit
        installed, and the unit is active (a guest deployed before, reached again)."""
        image_file = stub_image_path()
        result = machine.execute(
            "test -x %s && test -s %s && systemctl is-active -q %s && cat %s",
            TT_SMI_PATH,
            image_file,
            SERVING_UNIT,
            f"{UNIT_DIR}/{SERVING_UNIT}",
            timeout=30,
        )
        if result.rc != 0:
            return False
        base = self._rendered(self.base_serving_profile, image_file)
        if result.stdout_text != render_units(base).units[SERVING_UNIT]:
            return False
        self._image_file = image_file
        return True

    def switch(self, machine: Machine, profile: Profile) -> None:
        """Install ``profile``'s units, reload and enable them, and restart the serving unit
        unless this switch leaves that to the caller."""
        config = self.installable(machine, profile.serving_profile)
        install_units(machine, config, "restarted" if self.restarts else "reloaded")

    def dry_run(self, machine: Machine, profile: Profile) -> DryRun:
        """The Nix core evaluates ``profile`` (assertions included), and its serving unit
        differs from the installed one: otherwise the switch would not restart it. Changes
        nothing on the machine."""
        try:
            config = self._rendered(profile.serving_profile, stub_image_path())
        except (ValueError, NixError) as error:
            return DryRun(False, None, f"the Nix core does not evaluate the target: {error}")
        installed = machine.execute("cat %s", f"{UNIT_DIR}/{SERVING_UNIT}", timeout=30)
        if installed.rc == 0 and installed.stdout_text == render_units(config).units[SERVING_UNIT]:
            return DryRun(True, False, f"the installed {SERVING_UNIT} is the target's already")
        return DryRun(True, True, f"the target's {SERVING_UNIT} differs from the installed one")

    def record_generation(self, machine: Machine) -> Generation:
        """The installed unit set, archived on the machine."""
        return record_unit_set(machine)
