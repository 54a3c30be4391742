"""What a machine shows, as data: the snapshot script, its parsed ``Snapshot``, and the redaction
of secrets before anything is kept (``vmtests.scenario`` says how the groups fit)."""
