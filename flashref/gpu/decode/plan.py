"""plan / run: a paged decode call checked and planned once, then launched many times.

A serving loop calls attention with the same shapes every token: the batch's block table
and lengths change their values, never their shapes. So the work is split in two, as
FlashInfer's wrappers split it:

    plan = PagedDecodePlan(q, k_pages, v_pages, block_table, lengths)   # once per layout
    O = plan.run(q, k_pages, v_pages)                                   # every token, layer

``PagedDecodePlan`` checks every argument as ``paged_decode_attention`` does, picks the
split count for the table's capacity (``max_pages * page_size`` keys), compiles the kernels
and allocates the output, lse and the splits' partials. ``run`` checks only that its arrays
are those the plan was made for (type, shape, dtype; contiguous and aligned) and launches:
no allocation, no copy, no synchronisation, no value read on the host. The table and
lengths are read by the kernels from device memory when they run, so a CUDA graph that
captured ``run`` (``torch.cuda.graph`` in its default mode, or a CuPy stream capture)
replays correctly while the lengths grow and pages are added. The output is the plan's own
buffer, written by every run: use it before the next run, or give ``out=``.
"""

from __future__ import annotations

from .. import _host
from .api import DecodeCall
from .checks import is_device_array


class PagedDecodePlan:
    """``paged_decode_attention`` planned once for a batch layout; ``run`` launches it.

    Args:
        q: ``(B, Hq, Nq, d)``, an array of the shape, dtype and kind the runs will pass (its
            values are not read); k_pages, v_pages: the pools ``(num_pages, Hkv, page_size,
            d)`` (one layer's: another layer's pools of the same shape run on the same plan).
        block_table, lengths: device int32 arrays ``(B, max_pages)``, ``(B,)`` of q's kind,
            read by the kernels at every run (their values are never read on the host).
        causal, scale, num_splits, version: as ``paged_decode_attention``.

    Attributes:
        out, lse: the buffers a run writes, ``(B, Hq, Nq, d)`` in q's dtype and ``(B, Hq, Nq)``
            float32 (arrays of q's kind). decode: the ``DecodePlan`` (splits, grid).
    """

    def __init__(
        self,
        q,
        k_pages,
        v_pages,
        block_table,
        lengths,
        *,
        causal="bottom_right",
        scale=None,
        num_splits=None,
        version=None,
    ):
        for name, x in (("block_table", block_table), ("lengths", lengths)):
            if not is_device_array(x):
                raise TypeError(
                    f"{name} must be a device array (a CuPy array or a CUDA tensor): a plan "
                    "reads the tables where they are at every run; for host tables call "
                    "paged_decode_attention"
                )
        arrays, tables = (q, k_pages, v_pages), (block_table, lengths)
        call = DecodeCall(True, arrays, tables, (causal, scale, num_splits, False, version))
        call.prepare(*arrays, *tables)
        b = self._b = call.backend
        for name, x in zip(("block_table", "lengths"), tables, strict=True):
            if str(x.dtype).removeprefix("torch.") != "int32":
                raise TypeError(f"{name} has dtype {x.dtype}; a plan takes int32 tables")
            if not b.contiguous(x):
                raise ValueError(f"{name} must be C-contiguous")
        if call.direct is None:  # the versions whose launch counts arrivals (4, 5)
            raise ValueError(
                f"decode version {call.version} cannot be planned (its split blocks count "
                "arrivals in a buffer of the call); use a version with a combine kernel"
            )
        self._call, self.decode = call.direct, call.plan
        self._call.pinned = self._call.device  # held by its caller: runs on its own device
        B, Hq, Nq, d = call.shape
        with call.on_device():
            self.out = b.empty((B, Hq, Nq, d), q.dtype)
            self.lse = b.empty((B, Hq, Nq), "float32")
            S = self.decode.num_splits
            self._ws = b.empty((B * Hq * Nq * S * (d + 1),), "float32") if S > 1 else None
        self._tables = tables  # kept alive: the kernels read them
        self._key = _host.signature(arrays, ())
        self._ptrs = (b.ptr(block_table), b.ptr(lengths), b.ptr(self.lse))
        self.empty = B == 0

    def run(self, q, k_pages, v_pages, *, out=None):
        """Attention of ``q`` to the pools through the plan's table; returns ``self.out`` (or
        ``out``: an array like it). Checks only that the arrays match the plan."""
        b = self._b
        if _host.signature((q, k_pages, v_pages), ()) != self._key:
            raise ValueError(
                "q, k_pages and v_pages must have the type, shape, dtype and device the plan "
                "was made for; make a new plan for a new layout"
            )
        if out is not None and (
            _host.signature((out,), ()) != _host.signature((self.out,), ()) or not b.contiguous(out)
        ):
            raise ValueError("out must be a C-contiguous array like plan.out")
        ptrs = self._call.addresses((q, k_pages, v_pages))
        if ptrs is None:
            raise ValueError(
                "q, k_pages and v_pages must be C-contiguous and start at 16-byte aligned addresses"
            )
        qp, kp, vp = ptrs
        O = self.out if out is None else out
        if self.empty:
            return O
        Op = b.ptr(O)
        bt_p, len_p, Lp = self._ptrs
        if self._ws is None:
            Opart, Lpart = Op, Lp
        else:
            Opart = b.ptr(self._ws)
            Lpart = Opart + self._call.lse_offset
        self._call.launch_at(qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, b.stream_ptr())
        return O
