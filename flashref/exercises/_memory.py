"""Did a correct tiled answer tile? Its peak memory says.

NumPy reports its array allocations to ``tracemalloc``, so the traced peak during
one call is the extra memory that call needed (the inputs exist before tracing
starts). Plain attention builds the whole score matrix ``S (Nq, Nk)``; a tiled
loop holds the output, the running ``m`` and ``l``, and a few arrays the size of
one ``(Br, Bc)`` tile. The checkers measure two cases large enough for the two to
be told apart by a wide margin (``_cases.memory_cases``): Nq = Nk = 2048, d = dv = 16,
with tall 512 x 32 tiles and then wide 32 x 512 ones, so that an array spanning every
key of a query tile, ``(Br, Nk)``, or every query of a key tile, ``(Nq, Bc)``, is 8 MiB
in one of them, whichever loop order leaves it.

The budget for a tiled loop (``tiled_budget``) is twice the bytes of q, k, v and
O together (room for a scaled copy of q, a transposed copy of k, the output and
a second buffer for it) plus eight float64 ``(Br, Bc)`` tiles (S, P, a mask and
the temporaries ``np.exp`` and ``np.where`` make): 3 MiB in both cases. Measured
peaks there: 1.3-1.7 MiB for four correct tiled solutions (both loop orders,
flashref's own); for query tiles against every key at once, 33 MiB with tall tiles
(3.0 with wide ones); for key tiles against every query at once, 18 MiB with wide
tiles (2.9 with tall ones); 97 MiB for plain attention in both. So one case over
budget names the side that was not tiled, both name the whole score matrix
(``name_untiled``).

The measurement itself is guarded (``peak_memory``): a function cannot switch
tracemalloc off or reset its peak unseen, and a call into a library whose arrays
tracemalloc cannot see (torch, CuPy, JAX), or into one that runs code in another process
(``multiprocessing``, ``concurrent.futures.ProcessPoolExecutor``, ``subprocess``, ``os.fork``),
makes the case say it cannot measure (``cannot_measure``) rather than pass.
"""

from __future__ import annotations

import sys
import tracemalloc
from contextlib import contextmanager

NOT_TILED = "not tiled: the whole (Nq, Nk) score matrix was built"
UNTILED_KEYS = "keys not tiled: score arrays wider than block_k"
UNTILED_QUERIES = "queries not tiled: score arrays taller than block_q"


# Libraries whose arrays live outside Python's allocator: tracemalloc does not see them
FOREIGN = ("torch", "cupy", "jax", "jaxlib", "tensorflow", "numba", "mlx")
# Ways to run code in another process, whose memory tracemalloc does not see either: the
# Python modules that start one, and the C functions of os that do (fork, spawn, exec, system)
PROCESS_MODULES = ("multiprocessing", "concurrent.futures.process", "subprocess")
PROCESS_CALLS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve")
PROCESS_CALLS += ("execv", "execve", "execvp", "execvpe")
# What a function may not do to the measurement while it is measured
TRACEMALLOC_CONTROLS = ("stop", "start", "reset_peak", "clear_traces")


class _Peak:
    bytes: int = 0
    foreign: str | None = None  # the first call into a FOREIGN library, by name
    elsewhere: str | None = None  # the first call that runs code in another process
    tampered: str | None = None  # what the function did to tracemalloc


def _module_of(frame, event: str, arg) -> str:
    if event == "call":
        return frame.f_globals.get("__name__") or ""
    module = getattr(arg, "__module__", None)  # a C function, or a method of a C type
    if not module:
        module = type(getattr(arg, "__self__", None)).__module__
    return module or ""


@contextmanager
def peak_memory(measure: bool = True):
    """Yield an object whose ``bytes`` is, afterwards, the peak traced during the block.

    Works whether or not tracing was already on (then only the peak is reset, and
    tracing stays on). The block cannot switch the measurement off: while it runs,
    ``tracemalloc.stop``, ``start``, ``reset_peak`` and ``clear_traces`` only record that
    they were called (``tampered``), tracing found off afterwards counts as stopped, and
    the peak is also sampled at every function call and return (``sys.setprofile``), so
    a peak reset through another name is still seen. A call into a library whose memory
    tracemalloc cannot see (``FOREIGN``: torch, CuPy, JAX, ...) is named in ``foreign``, a
    call that runs code in another process (``PROCESS_MODULES``, ``PROCESS_CALLS``) in
    ``elsewhere``. A measurement with any of them set cannot be trusted: ``cannot_measure``
    says why.
    """
    peak = _Peak()
    if not measure:
        yield peak
        return
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    real = {name: getattr(tracemalloc, name) for name in TRACEMALLOC_CONTROLS}
    traced = tracemalloc.get_traced_memory
    high = [0]

    def recorder(name):
        def called(*args, **kwargs):
            peak.tampered = peak.tampered or f"tracemalloc.{name}()"

        return called

    def sample(frame, event, arg):
        current = traced()[0]
        if current > high[0]:
            high[0] = current
        if event in ("call", "c_call") and not (peak.foreign and peak.elsewhere):
            module = _module_of(frame, event, arg)
            name = getattr(arg, "__qualname__", None) or frame.f_code.co_name
            called = f"{module}.{name}" if event == "c_call" else module
            if peak.foreign is None and module.split(".")[0] in FOREIGN:
                peak.foreign = called
            if peak.elsewhere is None and (
                module.startswith(PROCESS_MODULES)
                or (event == "c_call" and module in ("posix", "nt") and name in PROCESS_CALLS)
            ):
                peak.elsewhere = called

    outer = sys.getprofile()
    try:
        before = traced()[0]
        real["reset_peak"]()
        for name in TRACEMALLOC_CONTROLS:
            setattr(tracemalloc, name, recorder(name))
        sys.setprofile(sample)
        try:
            yield peak
        finally:
            sys.setprofile(outer)
            for name, fn in real.items():
                setattr(tracemalloc, name, fn)
        if tracemalloc.is_tracing():
            top = max(traced()[1], high[0])
        else:
            peak.tampered = peak.tampered or "tracemalloc.stop()"
            top = high[0]
        peak.bytes = max(top - before, 0)
    finally:
        if tracemalloc.is_tracing() and not was_tracing:
            real["stop"]()
        elif was_tracing and not tracemalloc.is_tracing():
            real["start"]()  # the caller's trace goes on (its earlier traces are gone)


def cannot_measure(peak: _Peak) -> str | None:
    """Why ``peak`` is no measurement of the call's memory, or None when it is one."""
    if peak.tampered:
        return (
            f"cannot measure the peak memory: the function called {peak.tampered} while it "
            "was measured; leave tracemalloc to the checker"
        )
    if peak.foreign:
        return (
            f"cannot measure the peak memory: the function called {peak.foreign}, whose "
            "arrays tracemalloc does not see; write the tile loop with NumPy"
        )
    if peak.elsewhere:
        return (
            f"cannot measure the peak memory: the function called {peak.elsewhere}, which "
            "runs code in another process, whose memory tracemalloc does not see; write the "
            "tile loop in this process"
        )
    return None


def tiled_budget(Nq: int, Nk: int, d: int, dv: int, Br: int, Bc: int) -> int:
    """Bytes a float64 tiled loop may need beyond its inputs (see the module docstring)."""
    q_k_v_O = 8 * (Nq * d + Nk * d + Nk * dv + Nq * dv)
    return 2 * q_k_v_O + 8 * 8 * min(Br, Nq) * min(Bc, Nk)


def memory_verdict(
    peak: int, Nq: int, Nk: int, budget: int, blocks: str, untiled: str, what: str = "the output is"
):
    """(problem, diagnosis) when ``peak`` is over the budget, else None. ``untiled`` is the
    mistake this case's tile shape shows (``UNTILED_KEYS`` for tall tiles, ``UNTILED_QUERIES``
    for wide ones); ``name_untiled`` makes it ``NOT_TILED`` when both shapes fail."""
    if peak <= budget:
        return None
    mib = 2**20
    problem = f"{what} right, but the call's peak memory was {peak / mib:.1f} MiB"
    within = f"a tiled loop with {blocks} needs at most {budget / mib:.1f} MiB"
    if peak >= 8 * Nq * Nk:
        S = f"the ({Nq}, {Nk}) score matrix alone is {8 * Nq * Nk / mib:.0f} MiB"
        return f"{problem}:\n  {S};\n  {within}", untiled
    return f"{problem}:\n  {within}", untiled


def name_untiled(result, labels) -> None:
    """Both memory cases (``labels``: their labels' common start) over budget: the loop tiles
    neither way round, so name the whole score matrix; one alone keeps its own name."""
    shapes = (UNTILED_KEYS, UNTILED_QUERIES)
    over = [
        i
        for i, f in enumerate(result.failures)
        if f.case.startswith(labels) and f.diagnosis in shapes
    ]
    if len(over) == 2:
        for i in over:
            f = result.failures[i]
            result.failures[i] = type(f)(f.case, f.problem, NOT_TILED)
