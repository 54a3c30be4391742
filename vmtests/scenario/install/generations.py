"""What a machine runs before a switch (its "generation"), the command that goes back to it, and
what a switch would do, asked before anything changes.

On NixOS a generation is the running toplevel (``/run/current-system``) and the system
profile's generation (``/nix/var/nix/profiles/system`` -> ``system-<N>-link``). Going back to
a recorded one exactly is ``nix-env -p /nix/var/nix/profiles/system --switch-generation N``
and then that profile's ``bin/switch-to-configuration switch``, run by ``systemd-run`` as
nixos-rebuild runs it (``ACTIVATION_PREFIX``): ``nixos-rebuild switch
--rollback`` would go to the generation before the current one, whichever that is (nixpkgs
``pkgs/by-name/ni/nixos-rebuild-ng/src/nixos_rebuild/services.py``, ``_rollback_system``,
and ``nix.py``, ``rollback``).

On the reference guest, which is Debian, a generation is the installed unit set: the
``/etc/systemd/system`` tree and the firewall's rules, archived before the switch under
``GENERATIONS_DIR`` and named by their digest. Going back restores the tree exactly, reloads
systemd, stops the units that no longer exist (as switch-to-configuration stops removed
units) and restarts the serving unit: the same steps, recorded and replayed the same way.

Either way the hugepage pools are recorded too and set back: a target's hugepage oneshot
reserves its pages at runtime, and neither switch-to-configuration nor the unit set's restore
gives them back (stopping a oneshot runs no ``ExecStop``), so a rollback would leave the base
with pages nothing reserves at boot (gone after the next reboot, held until then). Shrinking a
pool frees only pages nobody holds (kernel ``Documentation/admin-guide/mm/hugetlbpage.rst``).

Before a switch: ``nixos-rebuild dry-build`` proves the configuration evaluates (nixpkgs
``nixos-rebuild.8.scd``: it shows what would be built and does nothing else; exit 0 when it
evaluates), and ``dry-activate`` lists what activating it would do, on stderr:
``would stop the following units: ...``, ``would restart ...``, ``would start ...``
(``pkgs/by-name/sw/switch-to-configuration-ng/src/main.rs``). A changed service with the
default ``stopIfChanged`` is listed under stop and start, not restart, so the serving unit is
restarted when it is under restart or under start.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field

from vmtests.contracts.serving import POOL_SIZES, SERVING_UNIT, hugepages_path, parse_pools
from vmtests.driver.errors import DriverError
from vmtests.driver.machine import Machine
from vmtests.guest import firewall

SYSTEM_PROFILE = "/nix/var/nix/profiles/system"
CURRENT_SYSTEM = "/run/current-system"
GENERATIONS_DIR = "/var/lib/vmtests/generations"
UNIT_SET = ("etc/systemd/system", "etc/vmtests")
"""The reference guest's installed unit set, relative to ``/``: what its install step writes."""
_DRY_LINE = re.compile(r"^would (stop|restart|start) the following units: (.*)$", re.MULTILINE)
SWITCH_COMPARED_STATES = ("active", "activating")
"""The ``ActiveState`` of a unit switch-to-configuration compares with the new system's: it
stops, restarts or reloads only units in one of these states (nixpkgs
``pkgs/by-name/sw/switch-to-configuration-ng/src/main.rs``, ``collect_unit_changes``, over
``get_active_units``), so a failed or inactive unit is never on a ``would ...`` line of
dry-activate, however much it changed."""
UNIT_SET_DIGEST = (
    "cd / && { find " + " ".join(UNIT_SET) + " -printf '%y %p %l\\n' | LC_ALL=C sort; "
    "find " + " ".join(UNIT_SET) + " -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum; }"
    " | sha256sum | cut -c1-16"
)
"""Shell printing the digest of the reference guest's unit set (names, links, contents)."""
SWITCH_UNIT = "vmtests-switch-to-configuration"
ACTIVATION_PREFIX = (
    "systemd-run -E LOCALE_ARCHIVE -E NIXOS_INSTALL_BOOTLOADER=0 -E NIXOS_NO_CHECK --collect "
    f"--no-ask-password --pipe --quiet --service-type=exec --unit={SWITCH_UNIT}"
)
"""What runs ``switch-to-configuration`` as a transient unit of its own, as nixos-rebuild-ng
does (nixpkgs ``pkgs/by-name/ni/nixos-rebuild-ng/src/nixos_rebuild/nix.py``,
``SWITCH_TO_CONFIGURATION_CMD_PREFIX`` and ``switch_to_configuration``, which sets
``NIXOS_INSTALL_BOOTLOADER=0`` for ``-E`` to pass on), so that a dropped ssh connection or
our timeout cannot kill the activation halfway. flake.nix's prebuilt switch uses the same
(tests/eval/test_eval_nixos.py)."""
_OPERATOR_CHARS = frozenset("();<>|&")
"""What shlex's ``punctuation_chars`` makes operator tokens of."""
_SEPARATOR_CHARS = frozenset("();|&")
"""Operator tokens made of these only end a simple command (the others are redirections)."""


@dataclass(frozen=True)
class Generation:
    """What the machine ran before the switch and how to go back to it."""

    id: str
    """The toplevel store path (NixOS) or the unit set's digest (reference guest)."""
    description: str
    rollback_command: str
    """The exact shell command, run as root on the machine, that goes back."""
    current_command: str
    """Shell that prints the machine's current ``id``, to verify a rollback."""
    pools: dict[int, int] = field(default_factory=dict)
    """The hugepage pools then, ``{page size KiB: pages}``: a rollback sets them back."""

    def to_dict(self) -> dict[str, str]:
        """JSON form (without the verifying shell)."""
        data = asdict(self)
        del data["current_command"]
        return data


@dataclass(frozen=True)
class DryRun:
    """What a switch would do, asked before it runs; ``None``: cannot tell."""

    evaluates: bool | None
    restarts: bool | None
    detail: str


def pool_sizes(machine: Machine) -> dict[int, int]:
    """The machine's hugepage pools now, ``{page size KiB: pages}``."""
    return parse_pools(machine.execute(POOL_SIZES, timeout=30).stdout_text)


def pools_differ(recorded: dict[int, int], now: dict[int, int]) -> list[str]:
    """``<KiB> KiB: <now>, not <recorded>`` for every recorded pool that holds another size."""
    return [
        f"{kib} KiB: {now.get(kib, 0)}, not {count}"
        for kib, count in recorded.items()
        if now.get(kib, 0) != count
    ]


def _pools_back(pools: dict[int, int]) -> tuple[str, str]:
    """Shell that sets every hugepage pool back to ``pools``, and those sizes in words."""
    if not pools:
        return "true", "no hugepage pools"
    # Pools that shrink first: the pages they give back are what a growing pool (1 GiB pages
    # most of all, which need contiguous memory) may need.
    shrink = "; ".join(
        f'read n < {hugepages_path(kib)} && [ "$n" -gt {count} ] && echo {count} > '
        f"{hugepages_path(kib)}"
        for kib, count in pools.items()
    )
    back = (
        shrink
        + "; "
        + "; ".join(f"echo {count} > {hugepages_path(kib)}" for kib, count in pools.items())
    )
    sizes = ", ".join(f"{kib} KiB: {count}" for kib, count in pools.items())
    return f"{{ {back}; }}", f"hugepage pools {sizes}"


def _then_pools_back(profile_step: str, activation: str, pools: str) -> str:
    """``profile_step`` (which changes nothing when it fails), then ``activation`` and ``pools``
    whatever the activation exits with (switch-to-configuration exits 4 when a unit failed,
    with the system switched all the same), exiting as the activation did; ``(exit $rc)``, not
    ``exit``, so that the command can be pasted into an interactive shell."""
    return f"{profile_step} && {{ {activation}; rc=$?; {pools}; (exit $rc); }}"


def current_generation(machine: Machine) -> Generation:
    """The NixOS generation the machine runs; ``DriverError`` when it is not NixOS."""
    result = machine.execute(
        f"readlink -f {CURRENT_SYSTEM} && readlink {SYSTEM_PROFILE} && "
        f"readlink -f {SYSTEM_PROFILE}",
        timeout=30,
    )
    lines = result.stdout_text.split()
    if result.rc != 0 or len(lines) != 3:
        raise DriverError(
            f"{machine.name} has no {CURRENT_SYSTEM} and {SYSTEM_PROFILE}: not a NixOS host, so "
            "there is no generation to go back to (give --rollback-command, or --on-failure "
            "leave)"
        )
    store_path, link, profile_path = lines
    if profile_path != store_path:
        # An older generation was booted, `nixos-rebuild test` activated one that is not the
        # profile's, or a specialisation runs (the activation links /run/current-system to
        # its own toplevel, nixos/modules/system/activation/activation-script.nix): the
        # profile's generation is not what runs.
        raise DriverError(
            f"{machine.name} runs {store_path}, but {SYSTEM_PROFILE} ({link}) is "
            f"{profile_path} (an older generation booted, `nixos-rebuild test`, or a "
            "specialisation): going back to the profile's generation would activate a system "
            "the host did not run; make the running system the profile's first (switch to it "
            "with nixos-rebuild switch, or reboot into the profile's generation), or give "
            "--rollback-command, or --on-failure leave"
        )
    pools = pool_sizes(machine)
    pools_back, sizes = _pools_back(pools)
    number = re.fullmatch(r"system-(\d+)-link", link)
    if number is None:
        # Set the profile too, so that the boot entry follows the system going back.
        profile_step = f"nix-env -p {SYSTEM_PROFILE} --set {store_path}"
        activation = f"{ACTIVATION_PREFIX} {store_path}/bin/switch-to-configuration switch"
        where = f"{store_path} (the profile points at {link}, not a generation link)"
    else:
        profile_step = f"nix-env -p {SYSTEM_PROFILE} --switch-generation {number[1]}"
        activation = f"{ACTIVATION_PREFIX} {SYSTEM_PROFILE}/bin/switch-to-configuration switch"
        where = f"{store_path} (generation {number[1]} of {SYSTEM_PROFILE})"
    return Generation(
        store_path,
        f"{where}, {sizes}",
        _then_pools_back(profile_step, activation, pools_back),
        f"readlink -f {CURRENT_SYSTEM}",
        pools,
    )


def record_unit_set(machine: Machine) -> Generation:
    """Archive the reference guest's unit set on the machine; return it as a generation."""
    digest = machine.succeed(UNIT_SET_DIGEST, timeout=60).strip()
    archive = f"{GENERATIONS_DIR}/{digest}.tar"
    machine.succeed(
        f"mkdir -p {GENERATIONS_DIR} && tar -C / -cf {archive}.tmp {' '.join(UNIT_SET)} && "
        f"mv {archive}.tmp {archive}",
        timeout=60,
    )
    targets = " ".join(f"/{path}" for path in UNIT_SET)
    pools = pool_sizes(machine)
    pools_back, sizes = _pools_back(pools)
    rollback = (
        f"test -s {archive} && rm -rf {targets} && tar -C / -xf {archive} && "
        "systemctl daemon-reload && "
        # The unit is the first word of each line; `read` splits it off with no program (the
        # guest's PATH is the tool manifest, vmtests/contracts/instrumentation.json).
        "systemctl list-units --all --plain --no-legend --state=not-found "
        '| while read -r u _; do systemctl stop "$u"; done; '
        f"{pools_back}; {firewall.APPLY} && systemctl restart {SERVING_UNIT}"
    )
    description = (
        f"the installed unit set {digest} ({', '.join(UNIT_SET)}, archived in {archive}), {sizes}"
    )
    return Generation(digest, description, rollback, UNIT_SET_DIGEST, pools)


def simple_commands(command: str) -> list[list[str]]:
    """The words of each simple command in the shell ``command`` (split at ``&&``, ``||``,
    ``;``, ``|``, ``&`` and parentheses; redirections stay words of their command)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # as shlex.split: `#` inside a flake reference is no comment
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= _SEPARATOR_CHARS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def _join(words: list[str]) -> str:
    """Shell words back into a command. shlex splits ``2>&1`` into ``2``, ``>&``, ``1``: a
    redirection operator is written unquoted, joined to the word after it and to a file
    descriptor number before it (so a lone ``2 > f`` would come back as ``2>f``)."""
    text = ""
    for index, word in enumerate(words):
        if set(word) <= _OPERATOR_CHARS:
            glue = "" if index > 0 and words[index - 1].isdigit() else " "
            text += f"{glue}{word}"
        else:
            after_operator = index > 0 and set(words[index - 1]) <= _OPERATOR_CHARS
            text += f"{'' if after_operator else ' '}{shlex.quote(word)}"
    return text.strip()


def command_action(command: str, tool: str, action: str) -> str | None:
    """The simple command of ``command`` that runs ``tool`` with ``switch``, with ``switch``
    replaced by ``action`` (what comes before it, such as the ``nix-env --set`` of a compound
    switch, is left out: the dry action must not change the profile); None when ``command``
    does not run ``tool`` with ``switch``."""
    for words in simple_commands(command):
        for index, word in enumerate(words):
            if word.rsplit("/", 1)[-1] == tool:
                if "switch" not in words[index + 1 :]:
                    return None
                position = words.index("switch", index + 1)
                return _join([*words[:position], action, *words[position + 1 :]])
    return None


def restarts_in(output: str, unit: str = SERVING_UNIT) -> bool:
    """Whether dry-activate's output says ``unit`` would be (re)started."""
    lists = {
        kind: {u.strip() for u in units.split(",")} for kind, units in _DRY_LINE.findall(output)
    }
    return unit in lists.get("restart", set()) or unit in lists.get("start", set())


def nixos_dry_run(machine: Machine, command: str, timeout: float) -> DryRun:
    """Ask ``nixos-rebuild`` (dry-build, dry-activate) or ``switch-to-configuration``
    (dry-activate) what the switch ``command`` would do."""
    build = command_action(command, "nixos-rebuild", "dry-build")
    activate = command_action(command, "nixos-rebuild", "dry-activate") or command_action(
        command, "switch-to-configuration", "dry-activate"
    )
    if activate is None:
        return DryRun(
            None, None, f"cannot tell what {command!r} would do: not nixos-rebuild or "
            "switch-to-configuration with the switch action"
        )  # fmt: skip
    if build is not None:
        built = machine.execute(f"{build} 2>&1", timeout=timeout)
        if built.rc != 0:
            tail = built.stdout_text.strip().splitlines()[-1:] or ["(no output)"]
            return DryRun(False, None, f"`{build}` exited {built.rc}: {tail[0]}")
    activated = machine.execute(f"{activate} 2>&1", timeout=timeout)
    if activated.rc != 0:
        tail = activated.stdout_text.strip().splitlines()[-1:] or ["(no output)"]
        return DryRun(False, None, f"`{activate}` exited {activated.rc}: {tail[0]}")
    restarts = restarts_in(activated.stdout_text)
    said = "would restart" if restarts else "would not restart"
    return DryRun(True, restarts, f"`{activate}`: {said} {SERVING_UNIT}")
