"""The stubbed P150 device layer and the stub vLLM serving server.

Everything under ``vmtests.stub`` uses the Python standard library and ``vmtests.contracts``
only: the server and ``tt-smi`` run in a tiny container image and in a Debian guest with plain
python3. Installing the stub into a machine is ``vmtests.guest.stub_layer``'s job, and running
it as a local child is ``vmtests.guest.local_stub``'s.

- ``python3 -m vmtests.stub.server <vLLM args>``: the stub serving server (``server.py``),
  imitating vLLM 0.16.0 and the Tenstorrent plugin (``release.py``: every release-specific
  text, with the upstream file it follows; ``engine_config.py``: the engine's own config).
- ``python3 -m vmtests.stub.tt_smi``: the stub ``tt-smi`` 6.2.1 (``tt_smi.py``).
- ``knobs.py``: every environment variable the stub reads (device paths, timing, faults).
- ``features.py``: the features one server process runs, from ``vmtests.contracts.features``.
"""
