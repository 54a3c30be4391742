"""The persistence scenario: snapshot a machine, switch it, reboot it and prove what survived.

``snapshot`` records the live state over any ``Machine``; ``checks`` and ``sources`` judge one
snapshot, ``compare`` judges a pair; ``scenario`` runs S0 -> switch -> S1 -> reboot -> S2;
``reference_switch`` is the documented install step of the reference guest and ``controls``
the negative controls that prove the checks catch real persistence failures.
"""
