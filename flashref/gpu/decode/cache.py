"""The paged KV cache on the GPU, as a serving loop uses it: appends on the device.

``flashref.PagedKVCache`` keeps its pools in NumPy and appends with host copies. Here the
pools, the block table and the lengths are device arrays, and a step's appends are kernels
(``flashref/kernels/decode/paged_cache.cu``); the host keeps only the page allocation
(``flashref.kvcache.PageTable``, shared with the CPU cache), so that nothing crosses the
bus per token but the page numbers of a page a sequence starts (and none at all for pages
reserved ahead with ``reserve``)::

    cache = DevicePagedKVCache(num_pages, page_size, Hkv, d, max_batch=B, num_layers=L)
    seqs = [cache.new_sequence() for _ in range(B)]       # each takes a row of the table
    cache.begin_step(seqs, n)        # host: pages for n new tokens each; device: their slots
    for layer in range(L):
        cache.append(layer, k, v)    # k, v (len(seqs), Hkv, n, d): one kernel, all sequences
        O = plan.run(q, *cache.pools(layer))    # plan = cache.plan(q): flashref.gpu.decode.plan

A step is the host's half (``prepare_step``: checks, pages, the host's copy of the lengths)
and the device's half (``advance``: the slots of the new tokens from the device lengths,
which then grow). A CUDA graph captures ``advance``, the appends and the attention of a
step; before each replay the host calls ``prepare_step`` with the same sequences and ``n``
(it launches nothing). Every check happens on the host before any work: a step that would
need more pages than are free raises ``CacheFullError`` and changes nothing, on the host or
the device. A replay without its ``prepare_step`` cannot write outside the pool: a token
without a page gets no slot, its sequence does not grow, and ``check()`` reports it.

Row ``r`` of the table is the sequence of ``row_of(seq)``; attention runs over all
``max_batch`` rows (``q`` row ``r`` attends row ``r``'s pages; a row without a sequence has
length 0 and gives zeros), so that one plan and one graph serve a batch whose sequences
come and go.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from ...kvcache import PageTable
from .. import _host
from .._runtime import require_gpu
from ..registry import KERNEL_DIR
from .plan import PagedDecodePlan

DTYPES = ("float16", "bfloat16")
SLOT_THREADS = 128
APPEND_THREADS = 256
LIBRARIES = ("torch", "cupy")


def _positive(x, name: str, minimum: int = 1) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {x}")
    return int(x)


class DevicePagedKVCache:
    """Pools, block table and lengths on the GPU; page allocation on the host.

    Args:
        num_pages, page_size, num_kv_heads, head_dim: as ``flashref.PagedKVCache`` (K and V
            have the same head dim here).
        max_batch: rows of the block table: sequences held at once.
        max_pages_per_seq: the table's width (default: ``num_pages``); a sequence holds at
            most ``max_pages_per_seq * page_size`` tokens.
        num_layers: pools per cache, one per layer of a model (the table and lengths are
            shared: every layer holds the same tokens).
        max_step_tokens: the most new tokens of one step over all its sequences (default:
            the larger of ``max_batch`` and a whole sequence, ``max_pages_per_seq *
            page_size``).
        dtype: ``"float16"`` or ``"bfloat16"``.
        library: ``"torch"`` (tensors on ``device``) or ``"cupy"`` (arrays on CuPy's current
            device).

    Attributes:
        k_pages, v_pages: ``(num_layers, num_pages, Hkv, page_size, d)``.
        block_table: ``(max_batch, max_pages_per_seq)`` int32, -1 where no page;
        lengths: ``(max_batch,)`` int32 (device arrays: read them with ``lengths_now``).
        pages: the host's ``PageTable``; host_copies: host-to-device copies made so far.
    """

    def __init__(
        self,
        num_pages,
        page_size,
        num_kv_heads,
        head_dim,
        *,
        max_batch,
        max_pages_per_seq=None,
        num_layers=1,
        max_step_tokens=None,
        dtype="float16",
        library="torch",
        device=None,
    ):
        self.pages = PageTable(num_pages, page_size)
        self.page_size = self.pages.page_size
        self.num_kv_heads = _positive(num_kv_heads, "num_kv_heads")
        self.head_dim = _positive(head_dim, "head_dim")
        self.max_batch = _positive(max_batch, "max_batch")
        width = self.pages.num_pages if max_pages_per_seq is None else max_pages_per_seq
        self.max_pages_per_seq = _positive(width, "max_pages_per_seq")
        self.num_layers = _positive(num_layers, "num_layers")
        most = max_step_tokens
        if most is None:  # one token for every row, or a whole sequence in one step
            most = max(self.max_batch, self.max_pages_per_seq * self.page_size)
        self.max_step_tokens = _positive(most, "max_step_tokens")
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise TypeError(f"dtype is {dtype!r}; expected one of {DTYPES}")
        if (self.head_dim * 2) % 16:
            raise ValueError(f"head_dim is {head_dim}; a row must be a multiple of 16 bytes")
        if library not in LIBRARIES:
            raise ValueError(f"library is {library!r}; expected one of {LIBRARIES}")
        if device is not None:  # checked before the GPU is asked for: the same rule anywhere
            if library == "cupy":
                raise ValueError("device is for library='torch'; CuPy uses its current device")
            device = _positive(device, "device", 0)
        self.dtype, self.library = name, library
        cp = self._cp = require_gpu()
        shape = (
            self.num_layers,
            self.pages.num_pages,
            self.num_kv_heads,
            self.page_size,
            self.head_dim,
        )
        B, W = self.max_batch, self.max_pages_per_seq
        if library == "torch":
            import torch

            dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
            dt = getattr(torch, name)
            self.k_pages = torch.zeros(shape, dtype=dt, device=dev)
            self.v_pages = torch.zeros(shape, dtype=dt, device=dev)
            ints = functools.partial(torch.full, dtype=torch.int32, device=dev)
            self._b = _host.torch_backend(cp, self.k_pages)
            self._h2d = lambda x: torch.from_numpy(x).to(dev, non_blocking=False)
        else:
            if name == "bfloat16":
                import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, as CuPy needs)
            self.k_pages = cp.zeros(shape, dtype=name)
            self.v_pages = cp.zeros(shape, dtype=name)
            ints = functools.partial(cp.full, dtype=cp.int32)
            self._b = _host.cupy_backend(cp)
            self._h2d = cp.asarray
        self.block_table = ints((B, W), -1)
        self.lengths = ints((B,), 0)
        self._step_rows = ints((B,), 0)
        self._slots = ints((self.max_step_tokens,), -1)
        self._overflow = ints((1,), 0)
        here = self._b.device if self._b.device is not None else cp.cuda.runtime.getDevice()
        self._plan = _host.Plan(cp, self._b, here)  # the appends' plan: on the pools' device
        self._fns = None  # the kernels by name, compiled at the first launch
        self._device = here
        self._rows: dict[int, int] = {}  # seq -> its row of the table
        self._free_rows = list(range(B))
        self._layout = None  # (rows, n) of the last prepared step
        self._device_layout = None  # (rows, n) held by the device's step_rows
        self.host_copies = 0

    # -- sequences -------------------------------------------------------------------------

    def new_sequence(self) -> int:
        """Start an empty sequence in a free row of the table; returns its id."""
        if not self._free_rows:
            raise ValueError(
                f"all {self.max_batch} rows of the table (max_batch) hold a sequence; free one"
            )
        seq = self.pages.new_sequence()
        self._rows[seq] = self._free_rows.pop(0)
        return seq

    def row_of(self, seq) -> int:
        """The row of the table (and of ``q`` in a plan's run) that holds sequence ``seq``."""
        return self._rows[self.pages.check_seq(seq)]

    def free(self, seq) -> None:
        """End ``seq``: its pages go back to the pool, its row (length 0, no pages) to the
        free rows. Two fills on the device, no copy."""
        seq = self.pages.check_seq(seq)
        row = self._rows.pop(seq)
        self.pages.free(seq)
        self.block_table[row] = -1
        self.lengths[row] = 0
        self._free_rows.append(row)
        self._layout = None

    def reserve(self, seq, tokens) -> None:
        """Pages for ``tokens`` more tokens of ``seq`` now (one copy of the new page numbers),
        so that the steps that fill them copy nothing. ``CacheFullError``: nothing changes."""
        seq = self.pages.check_seq(seq)
        tokens = _positive(tokens, "tokens", 0)
        self._check_width({seq: tokens})
        self._write_pages(self.pages.reserve({seq: tokens}))

    def _check_width(self, needs) -> None:
        cap = self.max_pages_per_seq * self.page_size
        for s, n in needs.items():
            if self.pages.lengths[s] + n > cap:
                raise ValueError(
                    f"sequence {s} would hold {self.pages.lengths[s] + n} tokens; the table "
                    f"holds at most max_pages_per_seq * page_size = {cap} per sequence"
                )

    def _write_pages(self, first: dict) -> None:
        """Copy the new page numbers of each sequence (``{seq: first new index}``) up."""
        for s, i in first.items():
            pages = np.asarray(self.pages.block_tables[s][i:], dtype=np.int32)
            self.block_table[self._rows[s], i : i + len(pages)] = self._h2d(pages)
            self.host_copies += 1

    # -- a step ----------------------------------------------------------------------------

    def prepare_step(self, seqs, n) -> None:
        """The host's half of a step adding ``n`` tokens to each of ``seqs``: checks, pages
        where a sequence needs one (``CacheFullError`` before anything changes), the host's
        lengths. Launches nothing; copies only new page numbers, and the step's rows when
        they differ from the last step's."""
        if isinstance(seqs, (str, bytes)) or not hasattr(seqs, "__len__"):
            raise TypeError(f"seqs must be a list of sequence ids, got {type(seqs).__name__}")
        seqs = [self.pages.check_seq(s, f"seqs[{i}]") for i, s in enumerate(seqs)]
        if not seqs:
            raise ValueError("seqs is empty: a step adds tokens to at least one sequence")
        if len(set(seqs)) != len(seqs):
            raise ValueError(f"seqs has a sequence twice: {seqs}")
        n = _positive(n, "n")
        needs = dict.fromkeys(seqs, n)
        self._check_width(needs)
        if len(seqs) * n > self.max_step_tokens:
            raise ValueError(
                f"the step adds {len(seqs)} x {n} tokens; the cache was made for at most "
                f"max_step_tokens = {self.max_step_tokens}"
            )
        self._write_pages(self.pages.reserve(needs))  # all or nothing
        for s in seqs:
            self.pages.lengths[s] += n
        rows = tuple(self._rows[s] for s in seqs)
        if (rows, n) != self._device_layout:
            self._step_rows[: len(rows)] = self._h2d(np.asarray(rows, dtype=np.int32))
            self.host_copies += 1
            self._device_layout = (rows, n)
        self._layout = (rows, n)

    def advance(self) -> None:
        """The device's half of the prepared step: each new token's slot from the device
        lengths, which then grow by ``n``. One kernel; what a graph captures."""
        if self._layout is None:
            raise RuntimeError("no step is prepared: call prepare_step (or begin_step) first")
        rows, n = self._layout
        b = self._b
        args = (
            b.ptr(self.lengths),
            b.ptr(self.block_table),
            b.ptr(self._step_rows),
            b.ptr(self._slots),
            b.ptr(self._overflow),
            np.int32(n),
            np.int32(self.max_pages_per_seq),
            np.int32(self.page_size),
        )
        self._launch("paged_slots", (len(rows), 1, 1), (SLOT_THREADS, 1, 1), args)

    def begin_step(self, seqs, n) -> None:
        """``prepare_step`` then ``advance``: a step outside a graph."""
        self.prepare_step(seqs, n)
        self.advance()

    def append(self, layer, k_new, v_new) -> None:
        """Write the step's new keys and values into ``layer``'s pools: ``k_new``, ``v_new``
        ``(len(seqs), Hkv, n, d)`` in the step's order, any strides with the last axis
        contiguous (16-byte aligned rows). One kernel, no copy of the inputs."""
        if self._layout is None:
            raise RuntimeError("no step is prepared: call prepare_step (or begin_step) first")
        rows, n = self._layout
        layer = _positive(layer, "layer", 0)
        if layer >= self.num_layers:
            raise ValueError(f"layer is {layer}; the cache has {self.num_layers} layers")
        want = (len(rows), self.num_kv_heads, n, self.head_dim)
        b = self._b
        strides = []
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            kind = "torch" if _host.is_torch(x) else "cupy"
            if kind != self.library:
                raise TypeError(f"{name} is a {kind} array but the cache is {self.library}'s")
            if tuple(x.shape) != want:
                raise ValueError(
                    f"{name} has shape {tuple(x.shape)}; the step expects {want} "
                    "(its sequences, Hkv, n, d)"
                )
            if str(x.dtype).removeprefix("torch.") != self.dtype:
                raise TypeError(f"{name} has dtype {x.dtype} but the cache holds {self.dtype}")
            if kind == "torch":
                if x.get_device() != self._device:
                    raise ValueError(
                        f"{name} is on {x.device}; the cache is on cuda:{self._device}"
                    )
                st = tuple(x.stride())
            else:
                st = tuple(s // x.itemsize for s in x.strides)
            if st[3] != 1 or any(s % 8 for s in st[:3]) or b.ptr(x) % 16:
                raise ValueError(
                    f"{name} must have its last axis contiguous and 16-byte aligned rows "
                    f"(strides {st} elements); make it with .contiguous()"
                )
            strides.append(tuple(np.int64(s // 8) for s in st[:3]))  # in 16-byte units
        chunks = self.head_dim * 2 // 16
        threads = min(APPEND_THREADS, -(-self.num_kv_heads * chunks // 32) * 32)
        args = (
            b.ptr(k_new),
            b.ptr(v_new),
            b.ptr(self.k_pages[layer]),
            b.ptr(self.v_pages[layer]),
            b.ptr(self._slots),
            np.int32(n),
            np.int32(self.num_kv_heads),
            np.int32(chunks),
            np.int32(self.page_size),
            *strides[0],
            *strides[1],
        )
        self._launch("paged_append", (len(rows) * n, 1, 1), (threads, 1, 1), args)

    def _launch(self, name, grid, block, args) -> None:
        plan = self._plan
        with plan.on_device():
            if self._fns is None:
                self._fns = _kernels(self._cp)
            plan.launch(self._fns[name], grid, block, 0, self._b.stream_ptr(), args)

    # -- reading it ------------------------------------------------------------------------

    def pools(self, layer):
        """``(k_pages, v_pages)`` of ``layer``: ``(num_pages, Hkv, page_size, d)`` views."""
        layer = _positive(layer, "layer", 0)
        if layer >= self.num_layers:
            raise ValueError(f"layer is {layer}; the cache has {self.num_layers} layers")
        return self.k_pages[layer], self.v_pages[layer]

    def plan(self, q, **kwargs):
        """A ``PagedDecodePlan`` of ``q (max_batch, Hq, Nq, d)`` over this cache's table and
        lengths (any layer's pools: they share one shape); keyword arguments as
        ``PagedDecodePlan``'s."""

        k, v = self.pools(0)
        return PagedDecodePlan(q, k, v, self.block_table, self.lengths, **kwargs)

    def lengths_now(self) -> np.ndarray:
        """The device's lengths, read back (a synchronisation: for checks, not a loop)."""
        x = self.lengths
        return x.cpu().numpy() if self.library == "torch" else x.get()

    def check(self) -> None:
        """Raise if a step ran on the device without pages (a graph replayed without its
        ``prepare_step``): reads one int back, a synchronisation."""
        x = self._overflow
        missing = int(x.cpu().item() if self.library == "torch" else x.get()[0])
        if missing:
            raise RuntimeError(
                f"{missing} tokens found no page on the device and were not written (their "
                "sequences did not grow): call prepare_step before every replay of a step"
            )

    def gather(self, seq, layer):
        """Sequence ``seq``'s keys and values in ``layer``, contiguous: ``(Hkv, L, d)`` each
        (device arrays; the host's table says which pages)."""
        seq = self.pages.check_seq(seq)
        k, v = self.pools(layer)
        L, pages = self.pages.lengths[seq], self.pages.block_tables[seq]
        idx = self._h2d(np.asarray(pages, dtype=np.int64))
        out = []
        for pool in (k, v):
            x = pool[idx]  # (n_pages, Hkv, ps, d)
            x = x.transpose(0, 1) if self.library == "torch" else x.transpose(1, 0, 2, 3)
            out.append(x.reshape(self.num_kv_heads, -1, self.head_dim)[:, :L])
        return tuple(out)


KERNELS = ("paged_slots", "paged_append")


def _kernels(cp) -> dict:
    """The kernels of ``paged_cache.cu`` by name, compiled once per device."""
    from .._launch import compiled

    return dict(zip(KERNELS, compiled(("paged cache",), source, (), KERNELS), strict=True))


def source() -> str:
    """The text of ``paged_cache.cu`` (it includes nothing), as NVRTC is given it."""

    return (KERNEL_DIR / "decode" / "paged_cache.cu").read_text()
