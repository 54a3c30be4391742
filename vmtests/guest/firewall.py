"""The reference guest's firewall: what NixOS's does to incoming connections, as nftables.

NixOS turns its firewall on by default (nixpkgs ``nixos/modules/services/networking/
firewall.nix``): an incoming connection is dropped unless it comes in on ``lo``, belongs to a
connection the machine opened, or is for one of ``networking.firewall.allowedTCPPorts``; pings
and the ICMPv6 that IPv6 needs pass (``firewall-nftables.nix``, the ``input`` and
``input-allow`` chains). The driver reaches the serving port through QEMU's forwarded port,
which arrives from outside the guest, so a configuration that leaves that port closed times
out in the NixOS VM. Debian has no firewall; the reference guest gets this one, with the ports
of the configuration it installs, so that it times out there too.

The rules live in a table of their own (Docker keeps its tables beside it) and are applied by
``firewall.service``, the name of NixOS's unit, at every boot before the network comes up.
"""

from __future__ import annotations

from collections.abc import Sequence

FIREWALL_UNIT = "firewall.service"
RULES_FILE = "/etc/vmtests/firewall.nft"
TABLE = "inet vmtests-firewall"
NFT = "/usr/sbin/nft"
"""Debian's nftables package (the guest image installs it); only the unit runs it."""

UNIT_TEXT = f"""[Unit]
Description=Firewall (the configuration's networking.firewall, as NixOS applies it)
DefaultDependencies=false
Before=network-pre.target shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=true
ExecStart={NFT} -f {RULES_FILE}
ExecReload={NFT} -f {RULES_FILE}

[Install]
WantedBy=sysinit.target
"""


APPLY = f"systemctl reload-or-restart {FIREWALL_UNIT}"
"""Apply the written rules now (after a daemon-reload), as switch-to-configuration reloads
NixOS's changed ``firewall.service``."""


def ruleset(tcp_ports: Sequence[int] | None) -> str:
    """The nftables rules admitting ``tcp_ports``; ``None``: no firewall (the table removed).

    The file first creates and deletes the table, so that ``nft -f`` replaces it in one
    transaction whether it exists or not.
    """
    reset = f"table {TABLE} {{}}\ndelete table {TABLE}\n"
    if tcp_ports is None:
        return reset
    allowed = sorted(set(tcp_ports))
    ports = [f"    tcp dport {{ {', '.join(map(str, allowed))} }} accept"] if allowed else []
    return reset + "\n".join(
        [
            f"table {TABLE} {{",
            "  chain input {",
            "    type filter hook input priority filter; policy drop;",
            '    iifname "lo" accept',
            "    ct state vmap { invalid : drop, established : accept, related : accept, "
            "new : jump input-allow, untracked : jump input-allow }",
            "  }",
            "  chain input-allow {",
            *ports,
            "    icmp type echo-request accept",
            "    icmpv6 type != { nd-redirect, 139 } accept",
            "    ip6 daddr fe80::/64 udp dport 546 accept",
            "  }",
            "}",
            "",
        ]
    )


def firewall_files(tcp_ports: Sequence[int] | None) -> dict[str, str]:
    """The rules file and the unit that applies it at boot, for ``Machine.write_files``."""
    return {RULES_FILE: ruleset(tcp_ports), f"/etc/systemd/system/{FIREWALL_UNIT}": UNIT_TEXT}
