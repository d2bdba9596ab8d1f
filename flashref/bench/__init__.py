"""The measuring harness: everything that times, profiles or checks the kernels on a GPU.

One door, ``python -m flashref.bench SUBCOMMAND`` (``__main__``: ``--help`` lists the
subcommands by family), runs every program; each is the ``main(argv)`` of one module here.
The benchmarks print numbers beside a baseline measured in the same run and write JSON with
its provenance into ``results/``. They are not tests. The modules:

* ``cpu``: naive vs tiled NumPy attention; ``forward`` (``gpu``), ``backward``, ``decode``:
  the GPU benchmarks, sharing ``_common`` (shapes, timing, SDPA) and ``provenance``;
  ``roofs``: the GPU's measured ceilings; ``cli``: help, exit codes, what is missing;
* ``timing/``: ``call_time`` (host and kernel time of one call), ``graph_time`` (calls
  captured in a CUDA graph and replayed);
* ``profile/``: Nsight Compute over ``profile.ncu_target`` (``main``, ``decode``, ``hopper``,
  ``source``; ``ncu`` what they share); ``ncu_target`` is the one other program, the one
  Nsight Compute starts;
* ``selfcheck``: every version once against float64; ``ptx_snapshot``: the PTX of every
  build; ``hopper_probe``: the Hopper layout probes stage by stage;
* ``serving``, ``decode_split_sweep``, ``decode_host_time``, ``prefill_stamps``: the paged
  cache on the GPU, the decode split-count sweep, its host time, the prefill's clock stamps;
* ``calls``, ``host_profile``: the public calls beside SDPA's, and where their host time goes;
* ``ring``, ``ring_check``: ring attention over real devices;
* ``training``, ``training_step``: chapter 8's model trained with flashref and with SDPA,
  and where a step of it goes.
"""
