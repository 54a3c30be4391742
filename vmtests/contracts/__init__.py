"""The neutral contracts layer: facts that several layers of the suite share.

Nothing here imports anything else of ``vmtests``; every other package may import from here.

- ``instrumentation``: what every guest provides to the driver (consoles, backdoor, sshd,
  journald), read from ``instrumentation.json``, which ``modules/test-instrumentation.nix``
  reads too;
- ``features``: the qwen36 feature table (environment switches and banner texts), read from
  ``features.json``, a link to ``modules/serving/features.json`` that the Nix core reads;
- ``serving``: the serving unit's name, its port, its device, its hugepages and how long it may
  take to become ready;
- ``findings``: the stable keys of every result, ``Check`` and ``Reason``;
- ``settings``: every setting the suite reads from its environment, typed (``VMTESTS_*``);
- ``paths``: where the checkout is, and where the suite keeps what it builds once per machine.
"""
