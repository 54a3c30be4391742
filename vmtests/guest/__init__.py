"""The reference guest and the instrumentation contract every guest follows."""

REFERENCE_TARGET = "qemu:reference"
"""The target string of the built-in reference guest (``vmtests.guest.targets``), the default
of ``vmtests run``, ``vmtests certify`` and the pytest plugin's ``--target``."""
NIXOS_TARGET_PREFIX = "qemu-nixos:"
"""The prefix of a NixOS VM's target, followed by its run script."""
SSH_TARGET_PREFIX = "ssh://"
"""The prefix of an existing host's target, reached with ssh."""
TARGET_FORMS = (
    f"{REFERENCE_TARGET} | {NIXOS_TARGET_PREFIX}<run-vm script> | "
    f"{SSH_TARGET_PREFIX}[user@]host[:port]"
)
"""Every form of a target, as the commands' help and errors name them."""
