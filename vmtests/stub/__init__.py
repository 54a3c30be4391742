"""The stubbed P150 device layer and the stub vLLM serving server.

Everything under ``vmtests.stub`` except ``guest_install`` uses the Python standard library only:
the server and ``tt-smi`` run in a tiny container image and in a Debian guest with plain python3.

- ``python3 -m vmtests.stub.server <vLLM args>``: the stub serving server (``server.py``).
- ``python3 -m vmtests.stub.tt_smi``: the stub ``tt-smi`` (``tt_smi.py``).
- ``knobs.py``: every environment variable the stub reads (device paths, timing, faults).
- ``features.json``: a symlink to ``modules/serving/features.json``, the feature names and banners.
"""
