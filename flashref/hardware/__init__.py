"""NumPy models of the chip that the GPU chapters draw: fragment layouts, swizzles, schedules.

* ``fragments``: which lane holds which element of ``mma.sync`` and ``ldmatrix``
  (``fragment_figures`` draws them);
* ``warp_split``, ``banks``, ``cp_async_ring``: chapter 5's warp split of versions 2 and 3,
  the banks an ``ldmatrix`` reads with and without padding, and the copies and barriers of
  versions 5 and 11 (``kernel_figures`` draws them);
* ``hopper``: the 128-byte swizzle, the ``wgmma`` fragments (``hopper_figures``) and what
  the driver accepts of a TMA descriptor (``check_tensor_map_args``);
* ``pingpong``: version 23's turns between its two consumer warpgroups, and version 27's over
  a persistent block's list of work tiles; ``work_tiles`` the order of that list;
  ``persistent3`` version 28's (and 30's) three consumer warpgroups over such a list;
* ``backward_grid``: the backward kernels' grid, which query tiles each block visits and
  how many additions each element of dQ receives, checked against the kernels' own lines
  (it draws them too); ``staging_stores`` the bank wavefronts of versions 16 to 19's dQ
  staging stores;
* ``occupancy``: how many warps of a kernel an SM holds, from its registers and shared memory;
* ``exp2``: ``2^x`` on the FMA units (range reduction, a polynomial, an integer add to the
  exponent's bits), the software exponential FlashAttention-4 issues beside the SFU's ``ex2``;
* ``decode_figures``: chapter 10's pictures of a decode step.

They run on any machine, import NumPy and ``flashref._checks`` alone (matplotlib inside the
drawing functions), and are checked against the GPU by the probe kernels
(``flashref/kernels/probes/``, ``python -m flashref.bench hopper_probe``). The GPU runtime
stands on them (``flashref.gpu.tma`` checks a descriptor's arguments with ``hopper``); where a
model needs a kernel version's facts, the registry hands them over
(``flashref.gpu.forward_versions.lds_of``, ``flashref.gpu.backward_versions.backward_tiles``).
"""
