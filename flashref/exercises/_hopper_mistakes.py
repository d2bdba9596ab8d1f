"""The mistakes the Hopper checkers know, each written as the code a reader might write.

Every answer here is an integer (a register's place, a byte offset, a barrier's parity, a
count of commit groups), so a mistake is recognised by giving exactly the reader's answer
on a case where it differs from the right one. The right answers are the models of
``flashref.hardware.hopper`` and the kernels' own rules (``hopper_common.cuh``,
``v20_warp_specialised.cu``, ``v21_overlap.cu``).
"""

from __future__ import annotations

from ..hardware import hopper as hp

# --- the wgmma accumulator ---------------------------------------------------------------------

NO_WARP_OFFSET = (
    "chapter 5's 16 x 8 tile without the warp's offset: warp w = thread // 32 holds rows "
    "16 w to 16 w + 15, so the row is 16 w + g (or + 8)"
)
G_OVER_WARPGROUP = (
    "g = thread // 4 over the whole warpgroup: g = lane // 4 inside each warp "
    "(lane = thread % 32), and the warp adds 16 w"
)
HALVES_SWAPPED = (
    "the two rows swapped: registers 4 j and 4 j + 1 are row g, registers 4 j + 2 and "
    "4 j + 3 are row g + 8"
)
BLOCK_PER_PAIR = (
    "a new 8-column block every two registers: one block takes four registers (two rows "
    "of two columns), so the block is j = reg // 4"
)
COLUMN_NOT_PAIRED = (
    "column 8 j + t + 4 (reg % 2): a thread's two columns are neighbours, 8 j + 2 t and "
    "8 j + 2 t + 1 (a pair packs into one 32-bit register as P)"
)


def wgmma_c_candidates(thread: int, reg: int, n: int) -> list[tuple[str, tuple[int, int]]]:
    """(name, (row, col)) of every accumulator mistake, for one thread and register."""
    w, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    j, e = reg // 4, reg % 4
    lower = 8 * (e // 2)
    col = 8 * j + 2 * t + e % 2
    return [
        (NO_WARP_OFFSET, (g + lower, col)),
        (G_OVER_WARPGROUP, (thread // 4 + lower, col)),
        (HALVES_SWAPPED, (16 * w + g + 8 - lower, col)),
        (BLOCK_PER_PAIR, (16 * w + g + lower, 8 * (reg // 2) + 2 * t + e % 2)),
        (COLUMN_NOT_PAIRED, (16 * w + g + lower, 8 * j + t + 4 * (e % 2))),
    ]


# --- the 128-byte swizzle ----------------------------------------------------------------------

NO_SWIZZLE = "no swizzle: r * 128 + 2 c, the layout whose reads take eight passes"
ELEMENT_XOR = (
    "the element index XORed, c ^ (r % 8): the swizzle moves whole 16-byte chunks, "
    "chunk (c // 8) ^ (r % 8), and keeps the element's place c % 8 inside it"
)
ROW_NOT_MOD_8 = (
    "the chunk XORed with r instead of r % 8: from row 8 on the chunk leaves its 128-byte "
    "row (the pattern repeats every 8 rows, 1024 bytes)"
)
SWIZZLE_64 = "the 64-byte swizzle's pattern, chunk ^ (r % 4): the 128-byte swizzle uses r % 8"
ONE_BYTE_ELEMENTS = (
    "the place inside the chunk counted in elements, not bytes: 16-bit elements are 2 bytes, "
    "so + 2 (c % 8)"
)


def swizzle_candidates(r: int, c: int) -> list[tuple[str, int]]:
    """(name, byte offset) of every swizzle mistake, for element (r, c)."""
    chunk = (c // 8) ^ (r % 8)
    return [
        (NO_SWIZZLE, r * 128 + 2 * c),
        (ELEMENT_XOR, r * 128 + 2 * (c ^ (r % 8))),
        (ROW_NOT_MOD_8, r * 128 + ((c // 8) ^ r) * 16 + 2 * (c % 8)),
        (SWIZZLE_64, int(hp.swizzle_offset(r, c, 64))),
        (ONE_BYTE_ELEMENTS, r * 128 + chunk * 16 + c % 8),
    ]


# --- the consumers' wait: which buffer, which parity -------------------------------------------

PARITY_OF_TILE = (
    "the tile's own parity t % 2: tile t is buffer t % S's use t // S, and waits for the "
    "parity of that use, (t // S) % 2 (with t % 2 a tile can pass before it has landed)"
)
PARITY_ZERO = (
    "parity 0 every time: a buffer's second use waits for its barrier's second phase, "
    "parity 1, and parity 0 lets it through on the first phase (the old tile is read again)"
)
USE_NOT_PARITY = (
    "the use count t // S itself: the wait takes its parity, (t // S) % 2 (a barrier only "
    "tells a phase from its neighbours)"
)
TWO_BUFFER_RULE = (
    "the two-buffer ring's formula (buffer t % 2, parity (t // 2) % 2) with S buffers: "
    "use S for both"
)
BUFFER_PARITY = "the buffer's parity (t % S) % 2: the parity counts the buffer's uses, t // S"


def ring_candidates(t: int, stages: int) -> list[tuple[str, tuple[int, int]]]:
    """(name, (buffer, parity)) of every consumer-wait mistake, for tile t of the ring."""
    b = t % stages
    return [
        (PARITY_OF_TILE, (b, t % 2)),
        (PARITY_ZERO, (b, 0)),
        (USE_NOT_PARITY, (b, t // stages)),
        (TWO_BUFFER_RULE, (t % 2, (t // 2) % 2)),
        (BUFFER_PARITY, (b, b % 2)),
    ]


# --- the producer's wait on the "empty" barrier ------------------------------------------------

CONSUMER_PARITY = (
    "the consumers' parity (t // S) % 2: when the producer fills stage s for its use u, "
    "the empty barrier has completed u - 1 phases, one fewer than the full barrier, so the "
    "producer's parity is one ahead, (t // S + 1) % 2"
)
PRODUCER_TILE_PARITY = "the tile's parity: the stage's use t // S decides, not t"
PRODUCER_ZERO = "parity 0 every time: the empty barrier's phases alternate like the full one's"
PRODUCER_PREVIOUS_STAGE = (
    "the stage the tile before used, (t - 1) % S: the producer waits for the stage it is "
    "about to fill, t % S, to be emptied of tile t - S"
)


def producer_candidates(t: int, stages: int) -> list[tuple[str, tuple[int, int]]]:
    """(name, (stage, parity)) of every producer-wait mistake, for tile t."""
    s, use = t % stages, t // stages
    return [
        (CONSUMER_PARITY, (s, use % 2)),
        (PRODUCER_TILE_PARITY, (s, (t + 1) % 2)),
        (PRODUCER_ZERO, (s, 0)),
        (PRODUCER_PREVIOUS_STAGE, ((t - 1) % stages, (use + 1) % 2)),
    ]


def producer_effect(t: int, stages: int, parity: int) -> str | None:
    """What a wait for ``parity`` does at tile t's fill, or None where it is the right wait.

    ``mbarrier.try_wait.parity p`` returns once the phase of parity p has completed, that
    is, while the barrier's current phase has the other parity. When the producer asks,
    the stage's empty barrier has completed ``use - 1`` phases if the consumers still read
    tile t - S, ``use`` once they have released it (the first use: 0, and nobody will).
    """
    use = t // stages
    if parity not in (0, 1):
        return f"parity {parity} is not a parity (0 or 1)"
    if use == 0:
        if parity == 0:
            return (
                f"tile {t} is stage {t % stages}'s first use: a wait for parity 0 waits for a "
                "release that never comes (no tile was read from it): the kernel hangs"
            )
        return None
    if parity == use % 2:
        return (
            f"tile {t}: the wait returns while tile {t - stages} is still being read from "
            f"stage {t % stages}, and the copy overwrites it"
        )
    return None


# --- wgmma.wait_group<N> -----------------------------------------------------------------------

COUNTED_FROM_FIRST = (
    "counted from the first group committed: wait_group N waits until at most N groups are "
    "still running, and those are the most recent, so N is the number committed after it"
)
ONE_TOO_MANY = (
    "one too many: the groups committed after the one you need, not counting it (with N "
    "groups still running it may be one of them)"
)
WAIT_ALL = (
    "wait_group 0 every time: it is safe, but it waits for the groups committed after the "
    "one you need, and the overlap they were issued for is lost"
)


def wait_candidates(groups: list[str], needed: str) -> list[tuple[str, int]]:
    """(name, N) of every wait_group mistake."""
    i = groups.index(needed)
    return [
        (COUNTED_FROM_FIRST, i),
        (ONE_TOO_MANY, len(groups) - i),
        (WAIT_ALL, 0),
    ]


def wait_effect(groups: list[str], needed: str, N: int) -> str:
    """What ``wgmma.wait_group N`` does for a read of ``needed``'s accumulators."""
    after = len(groups) - 1 - groups.index(needed)
    if N > after:
        return (
            f"wait_group {N} may return with {needed} still running: its accumulators are "
            "read while the tensor cores write them"
        )
    waited = ", ".join(groups[len(groups) - after : len(groups) - N])
    return f"wait_group {N} also waits for {waited}, which the read does not need"
