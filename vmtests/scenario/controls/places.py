"""What the negative controls touch on the guest: the files, directories and variables their
mechanisms write (``vmtests.scenario.controls.catalogue``), their effects model
(``vmtests.scenario.controls.effects``) and the reset takes away."""

from __future__ import annotations

from vmtests.contracts.features import ENV_FEATURES, env_name
from vmtests.contracts.serving import SERVING_UNIT
from vmtests.scenario.install.reference_switch import UNIT_DIR

RUNTIME_DROP_IN_DIR = f"/run/systemd/system/{SERVING_UNIT}.d"
DURABLE_DROP_IN_DIR = f"{UNIT_DIR}/{SERVING_UNIT}.d"
RUNTIME_DROP_IN = f"{RUNTIME_DROP_IN_DIR}/50-validated.conf"
UNRELATED_DROP_IN = f"{RUNTIME_DROP_IN_DIR}/50-weight.conf"
BANNER_DROP_IN = f"{DURABLE_DROP_IN_DIR}/50-banner.conf"
MODEL_BUILD_DROP_IN = f"{DURABLE_DROP_IN_DIR}/50-model-build.conf"
WRAPPER_DROP_IN = f"{DURABLE_DROP_IN_DIR}/50-wrapper.conf"
LOG_RATE_LIMIT_DROP_IN = f"{DURABLE_DROP_IN_DIR}/50-log-rate-limit.conf"
LOG_RATE_LIMIT_BURST = 40
"""The flooded journal's rate limit: lines of the unit journald keeps per interval."""
LOG_FLOOD_LINES = 3000
"""Lines the stub logs at startup in the flooded-journal control, far past the burst."""
HAND_PID_FILE = "/run/vmtests-hand-serving.pid"
HAND_LOG = "/var/log/vmtests-hand-serving.log"
RUNTIME_CONFIG_DIR = "/run/tenstorrent-serving"
RUN_ENV_FILE = f"{RUNTIME_CONFIG_DIR}/features.env"
RUN_FLAGS_FILE = f"{RUNTIME_CONFIG_DIR}/flags.sh"
WRAPPER = "/usr/local/bin/tenstorrent-serving-wrapper"
UNRELATED_VARIABLE = "EDITOR"
VENDOR_UNIT_DIR = "/usr/lib/systemd/system"
TRANSIENT_DIR = "/run/systemd/transient"
FEATURE_VARIABLES = tuple(env_name(feature) for feature in ENV_FEATURES)
"""The feature switches' variables (``features.json``), which several mechanisms move."""
