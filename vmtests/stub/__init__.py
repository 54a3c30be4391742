"""The stubbed P150 device layer and the stub vLLM serving server.

Everything under ``vmtests.stub`` uses the Python standard library and ``vmtests.contracts``
only: the server and ``tt-smi`` run in a tiny container image and in a Debian guest with plain
python3. Installing the stub into a machine is ``vmtests.guest.stub_layer``'s job, and running
it as a local child is ``vmtests.guest.local_stub``'s.

- ``python3 -m vmtests.stub.server <vLLM args>``: the stub serving server (``server.py``).
- ``python3 -m vmtests.stub.tt_smi``: the stub ``tt-smi`` (``tt_smi.py``).
- ``knobs.py``: every environment variable the stub reads (device paths, timing, faults).
- ``features.py``: the features one server process runs, from ``vmtests.contracts.features``.
"""
