"""The persistence scenario: snapshot a machine, switch it, reboot it and prove what survived.

Five groups, each a package, and the prepared states on top; the arrows point down
(``tests/test_layers.py``):

- ``collection``: what a machine shows, as data: ``take_snapshot`` records the serving unit, its
  process or container, the journal and the host over any ``Machine`` in one round trip
  (``collect``), into a redacted ``Snapshot`` (``snapshot``, ``redact``);
- ``judgement``: pure checks of one snapshot or a pair (``checks.evaluate_stage`` runs every
  single-snapshot check: the profile, the server's own config, banners against argv/env,
  runtime-only sources, provenance, the card; ``compare`` judges S1 against S2), each result a
  ``CheckResult`` keyed by its ``Check`` and ``Reason`` (``results``);
- ``install``: taking a machine to a profile's configuration: the one ``Switcher`` protocol
  (``switching``), the reference guest's switch (``reference_switch``) and the units it installs,
  NixOS's own mapped onto the guest (``nixos_units``) or rendered from the Nix core
  (``serving_unit``);
- ``controls``: the negative controls, each declared once (``catalogue``), with its effect on a
  snapshot (``effects``), the reset built from their footprints (``reset``), the container path
  (``container_stop``) and every control, each on a guest of its own or all on one (``run``);
- ``runner``: S0 -> switch -> S1 -> reboot -> S2 (``scenario``) and the driver time it metered
  (``metering``);

and on top ``prepared``: the prepared states the scenario, the controls and the certification
start from, saved once and restored (``vmtests.guest.snapshot_cache``), and the controls' guests,
each restored in the state its control declares.
"""
