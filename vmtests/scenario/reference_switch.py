"""The documented install ("switch") step of the reference guest.

The reference guest is Debian, not NixOS, so ``nixos-rebuild switch`` cannot run there. Instead
this step does what the module's switch would do, from the very same Nix core:

1. evaluate ``modules/serving/core.nix`` for the profile's serving profile with
   ``nix-instantiate`` on the HOST (``vmtests.nixcore.evaluate_core``);
2. render ``tenstorrent-serving.service``: ``ExecStartPre`` prints the module banner,
   ``ExecStart=/usr/bin/python3 -m vmtests.stub.server <core args>`` (the stub stands in for the
   container), ``Environment=`` is the core's environment, ``KillSignal=SIGTERM`` and
   ``TimeoutStopSec`` above the core's stop timeout;
3. render ``tenstorrent-hugepages.service`` when the core reserves hugepages: a oneshot
   ``WantedBy=sysinit.target`` with ``DefaultDependencies=no`` writing ``nr_hugepages``;
4. write both to ``/etc/systemd/system``, ``daemon-reload``, enable, restart (like
   switch-to-configuration restarting changed units), and wait until ``/health`` answers.

The base state S0 is the same install for ``hosts/profiles/baseline.nix``: the serving unit as
production had it before the change, without the validated features.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from vmtests.contracts.serving import HUGEPAGES_UNIT, SERVING_PORT, SERVING_UNIT
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest.stub_layer import GUEST_PYTHONPATH, install_stub_device_layer
from vmtests.nixcore import CoreOutput, evaluate_core
from vmtests.profiles import Profile
from vmtests.scenario.switching import wait_ready

UNIT_DIR = "/etc/systemd/system"
BASE_SERVING_PROFILE = "hosts/profiles/baseline.nix"
STOP_TIMEOUT_MARGIN = 30
# Guest memory for the scenario. A 1 GiB page needs a free, fully usable, 1 GiB-aligned region.
# Below 4 GiB the pc machine leaves [0,1G) to the kernel and [2G,3G) ends 140 KiB short; early
# allocations sit at the top of memory and KASLR moves the kernel. Measured: 3072, 4096 and
# 5120 MB reserved only 1 of 2 pages (at runtime and at boot); 6144 MB reserved 2 at boot but
# sometimes 1 at switch time. Untouched guest memory costs the host nothing under TCG.
SCENARIO_MEMORY_MB = 8192


@dataclass(frozen=True)
class ServingConfig:
    """What the reference guest's units run: the core's output, possibly altered by a control."""

    args: tuple[str, ...]
    environment: Mapping[str, str]
    banner: str
    hugepages: Mapping[str, object] | None
    stop_timeout: int
    extra_unit_lines: tuple[str, ...] = field(default=())

    @classmethod
    def from_core(cls, core: CoreOutput) -> ServingConfig:
        """The configuration the Nix core computed; refuses one with failed assertions."""
        if core.failed_assertions:
            raise ValueError("the Nix core failed assertions: " + "; ".join(core.failed_assertions))
        return cls(
            tuple(core.args), dict(core.environment), core.banner, core.hugepages, core.stop_timeout
        )

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


def systemd_quote(word: str) -> str:
    """Quote one word for a systemd ``Exec*=``/``Environment=`` line (no specifier expansion)."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%").replace("$", "$$") + '"'


def render_serving_unit(config: ServingConfig, python: str = "/usr/bin/python3") -> str:
    """The text of ``tenstorrent-serving.service`` for ``config``."""
    environment = {"PYTHONPATH": GUEST_PYTHONPATH, "PYTHONUNBUFFERED": "1"} | dict(
        config.environment
    )
    after = f"network.target {HUGEPAGES_UNIT}" if config.hugepages else "network.target"
    lines = [
        "# Rendered by vmtests.scenario.reference_switch from the Nix core's output.",
        "[Unit]",
        "Description=Tenstorrent LLM serving (vmtests reference guest: stub vLLM)",
        f"After={after}",
        *([f"Wants={HUGEPAGES_UNIT}"] if config.hugepages else []),
        "",
        "[Service]",
        "Type=simple",
        *(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in environment.items()),
        f"ExecStartPre=/bin/echo {systemd_quote(config.banner)}",
        f"ExecStart={python} -m vmtests.stub.server "
        + " ".join(systemd_quote(arg) for arg in config.args),
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={config.stop_timeout + STOP_TIMEOUT_MARGIN}",
        "Restart=on-failure",
        *config.extra_unit_lines,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def hugepages_path(size_kib: int) -> str:
    """The sysfs file holding the pool size of ``size_kib`` KiB pages."""
    return f"/sys/kernel/mm/hugepages/hugepages-{size_kib}kB/nr_hugepages"


def render_hugepages_unit(hugepages: Mapping[str, object]) -> str:
    """The text of the boot-time hugepage oneshot (``WantedBy=sysinit.target``)."""
    count, size, kib = hugepages["count"], hugepages["size"], int(str(hugepages["sizeKiB"]))
    return "\n".join(
        [
            "# Rendered by vmtests.scenario.reference_switch from the Nix core's output.",
            "[Unit]",
            f"Description=Reserve {count} x {size} hugepages for Tenstorrent serving",
            "DefaultDependencies=no",
            f"Before=sysinit.target {SERVING_UNIT}",
            "",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            f"ExecStart=/bin/sh -c {systemd_quote(f'echo {count} > {hugepages_path(kib)}')}",
            "",
            "[Install]",
            "WantedBy=sysinit.target",
            "",
        ]
    )


def _reserve_now(hugepages: Mapping[str, object]) -> str:
    """Start the hugepage unit now; retry after freeing memory when the pool came up short.

    At boot the unit runs before anything fragments memory. At switch time a 1 GiB page needs
    a free, aligned 1 GiB region, so drop the page cache and compact memory before each try
    (measured: one page short in some runs without this). The checks still see the result.
    """
    count = int(str(hugepages["count"]))
    path = hugepages_path(int(str(hugepages["sizeKiB"])))
    free = "sync; echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory"
    return (
        f"for try in 1 2 3; do {free}; systemctl restart {HUGEPAGES_UNIT} || exit 1; "
        f'[ "$(cat {path})" -ge {count} ] && break; done; true'
    )


def install_units(
    machine: Machine,
    config: ServingConfig,
    *,
    restart: bool = True,
    reload: bool = True,
    wait: bool = True,
) -> None:
    """Write the units for ``config``; reload, enable, restart and wait unless told not to."""
    machine.write_file(f"{UNIT_DIR}/{SERVING_UNIT}", render_serving_unit(config))
    if config.hugepages:
        machine.write_file(f"{UNIT_DIR}/{HUGEPAGES_UNIT}", render_hugepages_unit(config.hugepages))
    else:
        machine.succeed(
            f"systemctl disable --now {HUGEPAGES_UNIT} 2>/dev/null; "
            f"rm -f {UNIT_DIR}/{HUGEPAGES_UNIT}; true"
        )
    if not reload:
        return
    units = f"{HUGEPAGES_UNIT} {SERVING_UNIT}" if config.hugepages else SERVING_UNIT
    # One reload (enable would reload again): under TCG each costs seconds.
    machine.succeed(f"systemctl enable --no-reload {units} 2>&1 && systemctl daemon-reload")
    if restart:
        if config.hugepages:
            machine.succeed(_reserve_now(config.hugepages), timeout=120)
        machine.succeed(f"systemctl restart {SERVING_UNIT}", timeout=120)
        if wait:
            wait_ready(machine, config.port)


class ReferenceSwitch:
    """The reference guest's switch: base = baseline serving profile, target = the profile's."""

    def __init__(self, profile: Profile, base_serving_profile: str = BASE_SERVING_PROFILE) -> None:
        self.profile = profile
        self.base_serving_profile = base_serving_profile
        self.description = (
            f"reference install step: render units from the Nix core for {profile.serving_profile}"
        )
        self._target: ServingConfig | None = None
        self._base: ServingConfig | None = None

    @property
    def target(self) -> ServingConfig:
        """The target configuration (evaluated on the host once, then cached)."""
        if self._target is None:
            with log.nested(f"evaluating the Nix core for {self.profile.serving_profile}"):
                core = evaluate_core(profile_file=Path(self.profile.serving_profile))
                self._target = ServingConfig.from_core(core)
        return self._target

    @property
    def base(self) -> ServingConfig:
        """The base configuration (baseline serving profile)."""
        if self._base is None:
            with log.nested(f"evaluating the Nix core for {self.base_serving_profile}"):
                core = evaluate_core(profile_file=Path(self.base_serving_profile))
                self._base = ServingConfig.from_core(core)
        return self._base

    def prepare_base(self, machine: Machine) -> None:
        """Install the stub device layer and the base serving unit, and start it."""
        with log.nested("installing the stub device layer"):
            install_stub_device_layer(machine)
        with log.nested("installing the base serving unit"):
            install_units(machine, self.base)

    def apply(self, machine: Machine) -> None:
        """Render and install the target units, reload, enable and restart them."""
        install_units(machine, self.target, wait=False)
