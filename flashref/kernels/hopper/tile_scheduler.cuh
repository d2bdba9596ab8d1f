// The producer's K/V load and the work-tile order of the persistent versions (27 to 30),
// included by each after its tile constants: KV_BYTES (one K or V tile), NBOX (64-column
// boxes per row) and BOX_KV (bytes from one box of a tile to the next). work_tile's order
// is mirrored on the host by flashref.hardware.work_tiles, whose tests bound its balance.

#pragma once

// the producer thread: the K and V tile at row0 into stage (Ks, Vs), counted on barrier full
__device__ __forceinline__ void load_kv(u32 Ks, u32 Vs, const TensorMap* kmap, const TensorMap* vmap,
                                        int row0, u32 full)
{
    mbar_arrive_expect_tx(full, 2 * KV_BYTES);
#pragma unroll
    for (int b = 0; b < NBOX; b++) {
        tma_load_2d(Ks + b * BOX_KV, kmap, 64 * b, row0, full);
        tma_load_2d(Vs + b * BOX_KV, vmap, 64 * b, row0, full);
    }
}

// work tile `item` of Tr * BH: its query block and (batch, head). Without causal the Tr query
// blocks of one head are side by side, as version 23's grid has them; with causal the heads
// go in sections of G, and inside a section level by level (every head's longest query block
// first), every other level through the section's heads backwards
__device__ __forceinline__ void work_tile(int item, int Tr, int BH, int G, int causal, int& q_block,
                                          int& bh)
{
    if (!causal) {
        bh = item / Tr;
        q_block = item % Tr;
        return;
    }
    const int h0 = item / (G * Tr) * G, Gs = min(G, BH - h0);  // the section's first head, heads
    const int j = item - h0 * Tr;                               // place inside the section
    const int level = j / Gs, r = j % Gs;
    q_block = Tr - 1 - level;
    bh = h0 + ((level & 1) ? Gs - 1 - r : r);
}
