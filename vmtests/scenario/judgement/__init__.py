"""Pure checks of snapshots: every result a ``CheckResult`` keyed by its ``Check`` and ``Reason``
(``vmtests.scenario`` says how the groups fit)."""
