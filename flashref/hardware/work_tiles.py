"""The order in which the persistent blocks of versions 27 and 28 take their work tiles.

``flashref/kernels/hopper/v27_persistent.cu`` launches min(Tr x B*H, SMs) blocks; block b takes work
tiles b, b + grid, ... of one list (a work tile is a query block of one head). ``work_tile``
is the kernel's work_tile(): without causal a head's query blocks side by side; with causal the
heads in sections of ``section_heads`` (their K/V within ``L2_KV_BYTES``), each section level
by level, longest query blocks first. ``block_tiles`` gives one block's work tiles as
``flashref.hardware.pingpong.run_blocks`` takes them, each with its causal split (version 28's,
three warpgroups of a 192-row query block, as ``flashref.hardware.persistent3.run_blocks3`` takes
them). The section rule does not depend on Br: a section is counted in heads.
"""

from __future__ import annotations

from .._checks import check_block
from .pingpong import WorkTiles

L2_KV_BYTES = 30 << 20  # version 27's L2_KV_BYTES: K and V of a causal section of heads


def section_heads(Nk: int, d: int, BH: int) -> int:
    """Version 27's G: heads per causal section, G x Nk x d x 4 bytes of K/V <= L2_KV_BYTES."""
    Nk, d, BH = check_block(Nk, "Nk", 1), check_block(d, "d", 1), check_block(BH, "BH", 1)
    return max(1, min(BH, L2_KV_BYTES // (Nk * d * 4)))


def work_tile(item: int, Tr: int, BH: int, causal: bool, G: int | None = None) -> tuple[int, int]:
    """Version 27's work_tile(): (query block, head) of work tile ``item`` of ``Tr * BH``.
    Without causal a head's query blocks are side by side; with causal the heads go in sections
    of ``G`` (all of them if None), each level by level (every head's last query block first),
    every other level through the section's heads backwards."""
    Tr, BH = check_block(Tr, "Tr", 1), check_block(BH, "BH", 1)
    G = BH if G is None else check_block(G, "G", 1, BH)
    item = check_block(item, "item", 0, Tr * BH - 1)
    if not causal:
        return item % Tr, item // Tr
    h0 = item // (G * Tr) * G
    Gs = min(G, BH - h0)
    level, r = divmod(item - h0 * Tr, Gs)
    return Tr - 1 - level, h0 + (Gs - 1 - r if level % 2 else r)


def block_tiles(
    b: int,
    grid: int,
    Nq: int,
    Nk: int,
    BH: int,
    causal: bool,
    d: int = 128,
    Br: int = 128,
    Bc: int = 128,
    idle_past_nq: bool = False,
) -> WorkTiles:
    """The work tiles block ``b`` of ``grid`` takes in version 27 (b, b + grid, ...), each as
    (n_tiles, (n_mine of each of the Br / 64 warpgroups)) computed as the kernel computes them.
    Version 28 (Br = 192, three warpgroups) passes ``idle_past_nq``: as in version 24 a
    warpgroup whose 64 rows all lie past Nq has no tile of its own (n_mine = 0)."""
    Nq, Nk, BH, Br, Bc = (
        check_block(x, n, 1)
        for x, n in ((Nq, "Nq"), (Nk, "Nk"), (BH, "BH"), (Br, "Br"), (Bc, "Bc"))
    )
    if Br % 64:
        raise ValueError(f"Br must be a multiple of 64 (64 rows per warpgroup), got {Br}")
    Tr = -(-Nq // Br)
    grid = check_block(grid, "grid", 1, Tr * BH)
    b = check_block(b, "b", 0, grid - 1)
    G = section_heads(Nk, d, BH)
    out = []
    for item in range(b, Tr * BH, grid):
        q0 = work_tile(item, Tr, BH, causal, G)[0] * Br
        kv_end = min(Nk, q0 + Br) if causal else Nk
        n_tiles = -(-kv_end // Bc)
        split = tuple(
            0
            if idle_past_nq and q0 + cw * 64 >= Nq
            else min(n_tiles, (q0 + cw * 64 + 63) // Bc + 1)
            if causal
            else n_tiles
            for cw in range(Br // 64)
        )
        out.append((n_tiles, split))
    return out
