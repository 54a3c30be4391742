"""The reference guest and the instrumentation contract every guest follows."""

REFERENCE_TARGET = "qemu:reference"
"""The target string of the built-in reference guest (``vmtests.guest.targets``), the default
of ``vmtests run``, ``vmtests certify`` and the pytest plugin's ``--target``."""
