"""The persistence scenario's run: S0 -> switch -> S1 -> reboot -> S2 (``vmtests.scenario`` says how
the groups fit)."""
