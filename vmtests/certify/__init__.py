"""The hardware certification run (``vmtests certify``): the owner's gates and their report.

Modules, one job each: ``stats`` (bounds, bootstrap, noise band), ``degenerate`` (output
detector), ``golden`` (output shas recorded on an accepted configuration), ``prompts`` (the
frozen prompt sets), ``loadgen`` (streaming load generator), ``endpoint`` (how the host reaches
the serving port), ``hostops`` (unit restarts, stop checks, identity over a ``Machine``),
``arms`` (switching between configurations), ``gates`` and ``gates_perf`` (the stages),
``plan`` (the steps and time budget), ``run`` (the orchestrator) and ``report``/``html``.
"""
