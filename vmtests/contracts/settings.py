"""Every setting the suite reads from its environment, in one typed place.

Each field of ``Settings`` is declared once with ``setting(...)``: the variable it is read from
(``VMTESTS_*``), its default and the values it accepts; its docstring says what it means.
README's table of environment variables lists every variable the code reads, with its default
and meaning (``tests/test_settings.py`` holds the table to the code, and fails when the code
reads a variable the table lacks). Nothing else in the package reads these
variables: call ``settings()``, which reads the environment at each call, so that a variable set
for a while (a test, ``vmtests bench``) takes effect.

Values from elsewhere are layered over the environment's through the same declarations:
``Settings.overridden(values, origin)`` parses and checks ``field name -> text`` pairs (a host
file, a target's options) exactly as the environment's, names ``origin`` in its errors, and
remembers it (``Settings.origin``), so that a report can say where each value came from. The
settings declared ``per_host`` (timeouts, ssh options, the API key file, the container, the
port) are the ones a host's file and a target's options may set (``vmtests.guest.host_settings``;
docs/first-run.md says which values a real P150 host needs and why).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmtests.contracts.serving import READY_TIMEOUT, SERVING_CONTAINER, SERVING_PORT

# The keys of a setting's field metadata.
VARIABLE, SHOWN_DEFAULT, CHOICES, PARSE, PER_HOST = (
    "variable",
    "shown",
    "choices",
    "parse",
    "per_host",
)
DEFAULT_ORIGIN = "default"
NO_CONTAINER = "none"
"""The ``container`` setting's value for a serving unit whose main process is the server."""


ACCELERATORS = ("auto", "kvm", "tcg")
"""The values of the ``accel`` setting (QEMU's accelerator, or ``auto``)."""
REBOOT_MODES = ("restart", "reset")
"""The values of the ``reboot_mode`` setting."""
REAL_HOST_ORIGIN = "ssh:// default (a P150 host)"
REAL_HOST_DEFAULTS = {
    "ready_timeout": "5400",
    "reboot_timeout": "900",
    "switch_timeout": "1800",
}
"""The timeouts' defaults on an ``ssh://`` target, where a real P150 host answers: the ones
declared below suit the reference guest's stub server, and would fail a real run for the wrong
reason. ``ready_timeout``: tt-inference-server allows vLLM's start ``tensor_cache_timeout``
(3600 s for its single-card P150 specs, ``workflows/model_spec.py`` ``DeviceModelSpec``), and
budgets a startup at that plus 1800 s (``workflows/helm_generator/base_mapper.py``);
``reboot_timeout``: a server's firmware POST and BMC take minutes; ``switch_timeout``:
``nixos-rebuild switch --flake`` evaluates and builds on the host. docs/first-run.md says how
to set them from what the host shows; any other source (the environment, a host's file, the
target's options) wins over these."""


def _text(value: str) -> str:
    return value


def _timeout_shown(default: float, name: str) -> str:
    """A timeout's default as README shows it: the reference guest's, then a real host's."""
    return f"`{default:g}` s; `{REAL_HOST_DEFAULTS[name]}` s on an `ssh://` target"


def _path(value: str) -> Path | None:
    return Path(value).expanduser() if value else None


def _seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise ValueError(f"{value} is not a positive number of seconds")
    return seconds


def _port(value: str) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise ValueError(f"{value} is not a TCP port")
    return port


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{value} is not a boolean (true/false)")


def _container(value: str) -> str | None:
    return None if value == NO_CONTAINER else value


def setting(
    variable: str,
    default: object,
    *,
    choices: tuple[str, ...] = (),
    parse: Callable[[str], object] = _text,
    shown: str | None = None,
    per_host: bool = False,
) -> Any:
    """A ``Settings`` field read from ``variable``: ``default`` when it is unset or empty (shown
    in README as ``shown``), one of ``choices`` when there are any, converted by ``parse``
    (a ``ValueError`` says why a text does not parse); ``per_host``: a host's file and a
    target's options may set it too."""
    metadata = {
        VARIABLE: variable,
        SHOWN_DEFAULT: shown if shown is not None else f"`{default}`",
        CHOICES: choices,
        PARSE: parse,
        PER_HOST: per_host,
    }
    return field(default=default, metadata=metadata)


class SettingError(ValueError):
    """A setting holds a value the suite cannot use; the message names where it came from."""


@dataclass(frozen=True)
class Settings:
    """The suite's settings (see the module docstring); ``settings()`` reads them."""

    accel: str = setting("VMTESTS_ACCEL", "auto", choices=ACCELERATORS)
    """QEMU's accelerator: ``auto`` probes KVM once per host, kernel and QEMU, remembers the
    verdict for a day (``<cache>/kvm-verdict.json``) and falls back to TCG."""

    reboot_mode: str = setting("VMTESTS_REBOOT_MODE", "restart", choices=REBOOT_MODES)
    """How a QEMU guest reboots: ``restart`` (the guest shuts down, QEMU exits under
    ``-no-reboot`` and a fresh QEMU boots the same disk) or ``reset`` (QEMU resets it in place)."""

    qemu: str = setting("VMTESTS_QEMU", "qemu-system-x86_64")
    """The QEMU system emulator the driver runs."""

    cache_dir: Path | None = setting(
        "VMTESTS_CACHE_DIR",
        None,
        parse=_path,
        shown="`$XDG_CACHE_HOME/vmtests`, else `~/.cache/vmtests`",
    )
    """Where the suite keeps what it builds or learns once per machine: guest and stub images,
    the ssh key, the NixOS eval tier's nixpkgs tree, chroot and evaluations, the KVM verdict."""

    nixpkgs: Path | None = setting(
        "VMTESTS_NIXPKGS",
        None,
        parse=_path,
        shown="the tree `scripts/setup-nixos-eval` extracted into the cache, if any",
    )
    """A nixpkgs tree for the full NixOS evaluation (used as it is, never cached on disk)."""

    nixpkgs_lib: Path | None = setting(
        "NIXPKGS_LIB",
        None,
        parse=_path,
        shown="the cache's `nixpkgs-lib`, then the NixOS eval tier's tree, then `<nixpkgs/lib>`",
    )
    """A nixpkgs ``lib`` for the module tier."""

    debian_mirror: str = setting("VMTESTS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    """The Debian mirror the reference guest and the stub image are built from."""

    units: str = setting("VMTESTS_UNITS", "auto", choices=("auto", "nixos", "renderer"))
    """Which units the reference guest installs: ``nixos`` (the full NixOS evaluation's; an
    error where none can run), ``renderer`` (rendered from the Nix core) or ``auto`` (``nixos``
    where a nixpkgs tree is set up, else ``renderer``); every report says which ran and why."""

    snapshots: str = setting("VMTESTS_SNAPSHOTS", "on", choices=("on", "off"))
    """Whether reference guests start from the snapshot cache (``<cache>/snapshots``): ``on``
    saves a prepared guest once and restores it for every later test; ``off`` boots and
    prepares every guest (the negative controls then share one guest, reset between them)."""

    # ---- per host: also a host's ``--host-config`` file and a target's query options ----------

    ready_timeout: float = setting(
        "VMTESTS_READY_TIMEOUT",
        READY_TIMEOUT,
        parse=_seconds,
        shown=_timeout_shown(READY_TIMEOUT, "ready_timeout"),
        per_host=True,
    )
    """Seconds the server may take to answer ``/health`` after a start, a switch or a boot."""

    reboot_timeout: float = setting(
        "VMTESTS_REBOOT_TIMEOUT",
        300.0,
        parse=_seconds,
        shown=_timeout_shown(300.0, "reboot_timeout"),
        per_host=True,
    )
    """Seconds from a reboot request until the machine answers again (a host's POST included)."""

    switch_timeout: float = setting(
        "VMTESTS_SWITCH_TIMEOUT",
        900.0,
        parse=_seconds,
        shown=_timeout_shown(900.0, "switch_timeout"),
        per_host=True,
    )
    """Seconds a switch (or rollback) command may take: ``nixos-rebuild switch --flake``
    evaluates the whole NixOS configuration in the VM (once: ``--no-reexec`` skips nixpkgs
    nixos-rebuild-ng's ``services.reexec``, which would evaluate and build the target's
    ``system.build.nixos-rebuild`` first; ``--max-jobs 0`` builds nothing), then restarts the
    serving unit (stop up to its ``TimeoutStopSec``, image load, model load); docs/ci-time.md has
    what a shorter one left."""

    stop_timeout: float = setting(
        "VMTESTS_STOP_TIMEOUT", 180.0, parse=_seconds, shown="`180` s", per_host=True
    )
    """Seconds ``systemctl stop`` of the serving unit may take: the module's ``TimeoutStopSec``
    is its ``stopTimeout`` (60 s, the graceful ``docker stop -t``) plus 30 s, so twice that."""

    connect_timeout: float = setting(
        "VMTESTS_SSH_CONNECT_TIMEOUT", 15.0, parse=_seconds, shown="`15` s", per_host=True
    )
    """Seconds one ssh connection attempt may take (``ssh -o ConnectTimeout``)."""

    identity_file: Path | None = setting(
        "VMTESTS_SSH_IDENTITY_FILE", None, parse=_path, shown="ssh's own", per_host=True
    )
    """The private key ssh logs in with."""

    known_hosts: Path | None = setting(
        "VMTESTS_SSH_KNOWN_HOSTS", None, parse=_path, shown="ssh's own", per_host=True
    )
    """The known_hosts file that pins the host's key."""

    strict_host_key_checking: bool = setting(
        "VMTESTS_SSH_STRICT_HOST_KEY_CHECKING", True, parse=_boolean, shown="`true`", per_host=True
    )
    """Off only when asked for, and then logged: the host's identity is not verified."""

    sudo: bool | None = setting(
        "VMTESTS_SSH_SUDO", None, parse=_boolean, shown="when the user is not root", per_host=True
    )
    """Run commands on an ssh target through ``sudo -n``."""

    api_key_file: str | None = setting(
        "VMTESTS_API_KEY_FILE", None, shown="none (no key is sent)", per_host=True
    )
    """The file on the machine holding the server's API key: the key alone, or an environment
    file with ``VLLM_API_KEY=`` (what the container is given); read there, never copied here."""

    container: str | None = setting(
        "VMTESTS_CONTAINER", SERVING_CONTAINER, parse=_container, per_host=True
    )
    """The serving unit's docker/podman container (``docker inspect``); ``none``: the unit's
    main process is the server itself."""

    serving_port: int = setting("VMTESTS_SERVING_PORT", SERVING_PORT, parse=_port, per_host=True)
    """The port the server listens on, on the machine."""

    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Where each value that is not the default came from (field name -> origin); not a
    setting."""

    @classmethod
    def fields(cls) -> tuple[dataclasses.Field[Any], ...]:
        """The declared settings, in order."""
        return tuple(f for f in dataclasses.fields(cls) if VARIABLE in f.metadata)

    @classmethod
    def per_host(cls) -> tuple[str, ...]:
        """The names of the settings a host's file and a target's options may set."""
        return tuple(f.name for f in cls.fields() if f.metadata[PER_HOST])

    def origin(self, name: str) -> str:
        """Where setting ``name``'s value came from (``default`` when nothing set it)."""
        return self.origins.get(name, DEFAULT_ORIGIN)

    def describe(self) -> list[tuple[str, str, str]]:
        """Every per-host setting as (name, value, origin), for the reports; never a secret
        (the API key file is a path on the machine)."""
        rows = []
        for name in self.per_host():
            value = getattr(self, name)
            if value is None:
                text = "none"
            elif name.endswith("_timeout"):
                text = f"{value:g} s"
            else:
                text = str(value)
            rows.append((name, text, self.origin(name)))
        return rows

    def to_dict(self) -> dict[str, dict[str, str]]:
        """JSON form of ``describe``: name -> {value, source}."""
        return {name: {"value": text, "source": origin} for name, text, origin in self.describe()}

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable that field ``name`` is read from."""
        return str(next(f for f in cls.fields() if f.name == name).metadata[VARIABLE])

    def defaulted(self, values: Mapping[str, str], origin: str) -> Settings:
        """These settings with ``values`` taking the place of the declared defaults: only the
        settings nothing else set (``origin`` is still ``default``) change."""
        unset = {name: text for name, text in values.items() if self.origin(name) == DEFAULT_ORIGIN}
        return self.overridden(unset, origin)

    def overridden(self, values: Mapping[str, str], origin: str) -> Settings:
        """These settings with ``values`` (field name -> text) parsed and checked over them; an
        empty text keeps the current value. ``SettingError`` names ``origin`` and the field."""
        known = {f.name: f for f in self.fields()}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise SettingError(f"{origin}: unknown settings {unknown}; known: {sorted(known)}")
        changes: dict[str, Any] = {}
        for name, text in values.items():
            if not text:
                continue
            declared = known[name]
            choices = declared.metadata[CHOICES]
            value = text.strip().lower() if choices else text
            said = f"{origin}: {name} (${declared.metadata[VARIABLE]}) is {text!r}"
            if choices and value not in choices:
                raise SettingError(f"{said}: expected one of {', '.join(choices)}")
            try:
                changes[name] = declared.metadata[PARSE](value)
            except ValueError as error:
                raise SettingError(f"{said}: {error}") from error
        origins = {**self.origins, **dict.fromkeys(changes, origin)}
        return dataclasses.replace(self, **changes, origins=origins)


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings as ``environ`` (the process environment by default) gives them."""
    environ = os.environ if environ is None else environ
    variables = {f.name: environ.get(f.metadata[VARIABLE], "") for f in Settings.fields()}
    return Settings().overridden(variables, "the environment")
