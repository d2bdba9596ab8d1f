// The paged K/V cache's addressing, one role that the paged decode (versions 5 to 7) and the
// chunked prefill (paged_prefill.cu) include: the pools (num_pages, Hkv, page_size, D) are
// one 2-D tensor of num_pages * Hkv * page_size rows (what their TMA maps describe), and key
// t of a sequence lies in page block_table[t / page_size] at slot t % page_size, row
// (page * Hkv + hkv) * page_size + slot of K/V head hkv. The host checks that every row
// index fits an int (flashref.gpu.decode.checks.check_page_size, prefill's own check).
#pragma once

// the pools' row of slot `slot` of page `page`, K/V head hkv
__device__ __forceinline__ int pool_row(int page, int slot, int hkv, int Hkv, int page_size)
{
    return (page * Hkv + hkv) * page_size + slot;
}
