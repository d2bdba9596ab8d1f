"""The measuring harness: everything that times, profiles or checks the kernels on a GPU.

``python -m flashref.bench {cpu,gpu,decode,profile,roofs}`` runs the benchmarks; they print
numbers beside a baseline measured in the same run and write JSON with its provenance into
``results/``. They are not tests. The modules:

* ``cpu``: naive vs tiled NumPy attention; ``forward`` (``gpu``), ``backward``, ``decode``:
  the GPU benchmarks, sharing ``_common`` (shapes, timing, SDPA) and ``provenance``;
  ``roofs``: the GPU's measured ceilings;
* ``timing/``: ``call_time`` (host and kernel time of one call), ``graph_time`` (calls
  captured in a CUDA graph and replayed);
* ``profile/``: Nsight Compute over ``profile.ncu_target`` (``main``, ``decode``, ``hopper``,
  ``source``; ``ncu`` what they share);
* ``selfcheck``: every version once against float64 (``python -m flashref.bench.selfcheck``),
  ``hopper_probe``: the Hopper layout probes stage by stage;
* ``ring``, ``ring_check``: ring attention over real devices (``python -m flashref.bench.ring``);
* ``decode_split_sweep``, ``decode_host_time``: the decode split-count sweep and host time.
"""
