"""The stable keys of every finding: which check a result belongs to, and why a check failed.

A failed ``CheckResult`` (``vmtests.scenario.judgement.results``) carries a ``Check`` and a
``Reason``; its message is free text for people. Whatever acts on a failure (a negative control
saying it was caught, the certification's preflight, a report reader, CI tooling reading
``report.json``) matches these keys, never the message. The values are what ``report.json``,
``junit.xml`` and ``controls.json`` show, so they stay stable: add a member, do not rename one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Check(StrEnum):
    """What a result is about: one check, run on one snapshot or on a pair of them."""

    SNAPSHOT_EVIDENCE = "snapshot.evidence"
    SERVICE_ACTIVE = "service.active"
    SERVICE_HEALTH = "service.health"
    SERVICE_MODELS = "service.models"
    SERVICE_READY = "service.ready"
    SERVICE_RESTARTS = "service.restarts"
    PROFILE_ARGS = "profile.args"
    PROFILE_ENV = "profile.env"
    PROFILE_BANNER = "profile.banner"
    PROFILE_MODULE_BANNER = "profile.module-banner"
    PROFILE_HUGEPAGES = "profile.hugepages"
    SERVER_CACHE_CONFIG = "server.cache-config"
    CONSISTENCY = "consistency"
    RUNTIME_UNIT_FILE = "source.runtime-unit-file"
    RUNTIME_DROP_IN = "source.runtime-drop-in"
    MANAGER_ENVIRONMENT = "source.manager-environment"
    NOT_RELOADED = "source.not-reloaded"
    NOT_RESTARTED = "source.not-restarted"
    OUTSIDE_UNIT = "source.outside-unit"
    NOT_ENABLED = "source.not-enabled"
    HUGEPAGE_SOURCE = "source.hugepages"
    GENERATION = "source.generation"
    PROVENANCE = "source.provenance"
    UNRELATED = "source.unrelated"
    CARD = "device.tt-smi"
    GRACEFUL_STOP = "container.graceful-stop"
    DURABLE = "durable"
    REBOOT = "scenario.reboot"
    RESTART = "scenario.restart"
    SWITCHED_SYSTEM = "switch.system"
    # the run's preflight (vmtests.scenario.runner.preflight): asked before anything changes
    PREFLIGHT_TOOLS = "preflight.tools"
    PREFLIGHT_TT_SMI = "preflight.tt-smi"
    PREFLIGHT_MEMORY = "preflight.memory"
    PREFLIGHT_HUGEPAGES = "preflight.hugepages"
    PREFLIGHT_DISK = "preflight.disk"
    PREFLIGHT_ACTIVE = "preflight.active"
    PREFLIGHT_EVALUATES = "preflight.evaluates"
    PREFLIGHT_RESTARTS = "preflight.restarts"
    PREFLIGHT_API = "preflight.api"
    PREFLIGHT_GENERATION = "preflight.generation"


class Reason(StrEnum):
    """Why a check failed: one short key per distinct fault (several checks may share one)."""

    # the snapshot and the service
    INCOMPLETE_SNAPSHOT = "incomplete-snapshot"
    JOURNAL_SUPPRESSED = "journal-suppressed"  # journald's rate limit dropped the unit's lines
    NOT_ACTIVE = "not-active"
    NOT_ANSWERING = "not-answering"
    UNAUTHORIZED = "unauthorized"  # 401 under /v1: the server wants an API key (or another one)
    NOT_A_MODEL_LIST = "not-a-model-list"
    NO_MODEL = "no-model"
    NOT_READY = "not-ready"
    UNIT_RESTARTED = "unit-restarted"  # systemd restarted the unit on its own (Restart=)
    CONTAINER_RESTARTED = "container-restarted"  # the container engine restarted the container
    # the profile's expectations (vmtests.profiles.expectations.Mismatch.kind)
    ARG_MISSING = "arg-missing"
    ARG_VALUE = "arg-value"
    ARG_FORBIDDEN = "arg-forbidden"
    ENV_MISSING = "env-missing"
    ENV_VALUE = "env-value"
    ENV_FORBIDDEN = "env-forbidden"
    MODULE_BANNER_VALUE = "module-banner-value"
    MODULE_BANNER_MISSING = "module-banner-missing"
    MODULE_BANNER_MALFORMED = "module-banner-malformed"
    HUGEPAGES_COUNT = "hugepages-count"
    HUGEPAGES_SIZE = "hugepages-size"
    BANNER_MISSING = "banner-missing"
    BANNER_STALE = "banner-stale"
    BANNER_EARLIER_START = "banner-earlier-start"
    BANNER_FORBIDDEN = "banner-forbidden"
    # what the running server says about itself
    SERVER_SILENT = "server-silent"
    SERVER_DIFFERS = "server-differs"
    # banners against argv and environment
    NO_PROCESS = "no-process"
    CLAIM_WITHOUT_SWITCH = "claim-without-switch"
    SWITCH_WITHOUT_CLAIM = "switch-without-claim"
    CLAIM_DETAIL_DIFFERS = "claim-detail-differs"
    # where the live configuration comes from
    RUNTIME_UNIT_FILE = "runtime-unit-file"
    RUNTIME_DROP_IN = "runtime-drop-in"
    MANAGER_VARIABLE = "manager-variable"
    NEED_DAEMON_RELOAD = "need-daemon-reload"
    NO_LIVE_PROCESS = "no-live-process"
    ARGV_DIFFERS = "argv-differs"
    ENVIRONMENT_DIFFERS = "environment-differs"
    START_SCRIPT_MISSING = "start-script-missing"
    START_SCRIPT_UNREADABLE = "start-script-unreadable"
    LISTENER_UNKNOWN = "listener-unknown"
    OUTSIDE_UNIT = "outside-unit"
    NOT_ENABLED = "not-enabled"
    HUGEPAGE_UNIT_MASKED = "hugepage-unit-masked"
    HUGEPAGES_RUNTIME_ONLY = "hugepages-runtime-only"
    BOOT_DEFAULT_DIFFERS = "boot-default-differs"
    RUNTIME_ENV_FILE = "runtime-env-file"
    RUNTIME_SOURCED_FILE = "runtime-sourced-file"
    RUNTIME_SCRIPT = "runtime-script"
    RUNTIME_GENERATOR = "runtime-generator"
    # the card
    TT_SMI_FAILED = "tt-smi-failed"
    TT_SMI_UNREADABLE = "tt-smi-unreadable"
    NO_P150 = "no-p150"
    CARD_NOT_HELD = "card-not-held"
    # the container's stop
    NO_DIE_EVENT = "no-die-event"
    KILLED = "killed"
    # across stages
    CHANGED_ACROSS_REBOOT = "changed-across-reboot"
    DIGEST_UNSTABLE = "digest-unstable"
    NO_NEW_BOOT = "no-new-boot"
    WRONG_GENERATION_BOOTED = "wrong-generation-booted"
    SWITCH_DID_NOT_RESTART = "switch-did-not-restart"
    OTHER_SYSTEM_ACTIVATED = "other-system-activated"
    # the run's preflight
    TOOL_MISSING = "tool-missing"
    TOOL_TOO_OLD = "tool-too-old"
    LOW_MEMORY = "low-memory"
    HUGEPAGES_DO_NOT_FIT = "hugepages-do-not-fit"
    LOW_DISK = "low-disk"
    DOES_NOT_EVALUATE = "does-not-evaluate"
    SWITCH_CHANGES_NOTHING = "switch-changes-nothing"
    NO_GENERATION = "no-generation"


@dataclass(frozen=True, order=True)
class Finding:
    """One kind of failure: a check and the reason it failed for."""

    check: Check
    reason: Reason

    def __str__(self) -> str:
        return f"{self.check} ({self.reason})"
