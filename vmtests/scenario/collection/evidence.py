"""What a person would otherwise ssh in for when a stage fails, collected in one round trip.

``collect_evidence`` runs one shell script on the machine and returns its parts as named texts
(redacted), which the report writes under ``evidence/<stage>/``: the unit's journal of the
current and the previous boot, ``systemctl status`` of the serving and hugepage units, ``docker
inspect`` and the log tail of the container, the kernel's lines about tenstorrent (tt-kmd logs
``Loading Tenstorrent AI driver module v<version>`` at load, tt-kmd ``module.c``), the hugepage
lines of ``/proc/meminfo``, the ``tt-smi -s`` snapshot and ``systemd-analyze time`` (whose
``(firmware)`` and ``(loader)`` terms show how long the host's POST and boot loader took).
Every part is bounded (``timeout``), so a hung tool costs seconds, not the run.
"""

from __future__ import annotations

import shlex

from vmtests.contracts.serving import HUGEPAGES_UNIT, POOL_SIZES, SERVING_UNIT
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.scenario.collection.collect import MARK, split_sections
from vmtests.scenario.collection.redact import redact_text
from vmtests.tt_smi_parse import SNAPSHOT_COMMAND

EVIDENCE_TIMEOUT = 300.0
PART_TIMEOUT = 60
JOURNAL_LINES = 3000
LOG_TAIL_LINES = 500

_SCRIPT = r"""
unit=$1; hpunit=$2; container=$3; lines=$4; tail=$5; t=$6
sec() { printf '\n%s%s\n' "$MARK" "$1"; }
sec journal-current-boot
timeout "$t" journalctl --no-pager -o short-iso-precise -b 0 -u "$unit" -n "$lines" 2>&1
sec journal-previous-boot
timeout "$t" journalctl --no-pager -o short-iso-precise -b -1 -u "$unit" -n "$lines" 2>&1
sec systemctl-status
timeout "$t" systemctl status --no-pager -l "$unit" "$hpunit" 2>&1
sec docker-inspect
if [ -z "$container" ]; then echo "(no container: the unit's main process is the server)"
elif command -v docker >/dev/null; then timeout "$t" docker inspect "$container" 2>&1
elif command -v podman >/dev/null; then timeout "$t" podman inspect "$container" 2>&1
else echo "neither docker nor podman is on the PATH"; fi
sec container-log
if [ -z "$container" ]; then echo "(no container)"
elif command -v docker >/dev/null; then timeout "$t" docker logs --tail "$tail" "$container" 2>&1
elif command -v podman >/dev/null; then timeout "$t" podman logs --tail "$tail" "$container" 2>&1
fi
sec kernel-tenstorrent
timeout "$t" journalctl --no-pager -o short-iso-precise -k -b 0 2>&1 | grep -i tenstorrent \
  | tail -n "$tail"
sec meminfo
grep -iE '^(MemTotal|MemAvailable|Huge|Hugetlb)' /proc/meminfo
echo "pools (KiB pages):"; @POOL_SIZES@
sec tt-smi
if command -v tt-smi >/dev/null; then timeout "$t" sh -c "$SMI" 2>&1
else echo "tt-smi: not installed"; fi
sec systemd-analyze-time
timeout "$t" systemd-analyze time 2>&1
sec end
"""


def evidence_command(
    unit: str = SERVING_UNIT,
    hugepages_unit: str = HUGEPAGES_UNIT,
    container: str | None = None,
) -> str:
    """The shell command that prints every part of the evidence."""
    values = (unit, hugepages_unit, container or "", JOURNAL_LINES, LOG_TAIL_LINES, PART_TIMEOUT)
    arguments = " ".join(shlex.quote(str(value)) for value in values)
    script = _SCRIPT.replace("@POOL_SIZES@", POOL_SIZES)
    variables = f"MARK={shlex.quote(MARK)} SMI={shlex.quote(SNAPSHOT_COMMAND)}"
    return f"{variables} sh -c {shlex.quote(script)} vmtests-evidence {arguments}"


def collect_evidence(
    machine: Machine, *, container: str | None = None, unit: str = SERVING_UNIT
) -> dict[str, str]:
    """Every part of the evidence as ``{name: text}`` (redacted), never raising: a machine that
    no longer answers gives one part saying so."""
    with log.nested(f"collecting the evidence on {machine.name}"):
        try:
            result = machine.execute(
                evidence_command(unit, HUGEPAGES_UNIT, container), timeout=EVIDENCE_TIMEOUT
            )
        except DriverError as error:
            return {"unavailable": f"the evidence could not be collected: {error}"}
    sections = split_sections(result.stdout_text)
    parts = {name: redact_text(text) + "\n" for name, text in sections.items() if name != "end"}
    if result.rc != 0 or "end" not in sections:
        parts["collection"] = f"the evidence script exited {result.rc}: {result.stderr_text[-500:]}"
    return parts
