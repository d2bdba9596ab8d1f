// The paged KV cache on the GPU: the two kernels of a step that writes new tokens into it.
// Not an attention kernel and not a numbered version: flashref.gpu.DevicePagedKVCache
// launches them (flashref/gpu/decode/cache.py), and the decode kernels then read the pages.
//
// A step adds n tokens to each of R sequences (decoding: n = 1 for the whole batch; a
// prompt chunk: n tokens of one sequence). The host decides which pages exist (it allocates
// them and writes the block table, only when a sequence needs a new page); the device keeps
// the lengths, so a step needs nothing from the host and a CUDA graph can replay it:
//
//   paged_slots   once per step: for each of the step's rows (step_rows[r], a row of the
//                 block table), the slot of each new token, slot = page * page_size + offset,
//                 from the row's length before the step; then the length grows by n. A
//                 token whose page is missing (the host reserved too few) gets slot -1, the
//                 row's length does not grow, and `overflow` counts it: nothing is written
//                 out of the pool, and the host can read the count (DevicePagedKVCache.check).
//   paged_append  once per layer: copies each new token's K and V rows (Hkv rows of `chunks`
//                 16-byte pieces each) to its slot in the layer's pools (num_pages, Hkv,
//                 page_size, row), reading the new K and V through their strides; slot -1
//                 is skipped. The copy does not look at the values, so one kernel serves
//                 float16, bfloat16 and float32 caches.
//
// The slots are computed once per step and read by every layer's append (vLLM's
// slot_mapping, made on the device).

extern "C" __global__ void paged_slots(int* __restrict__ lengths,          // (max_batch,)
                                       const int* __restrict__ block_table,  // (max_batch, max_pages)
                                       const int* __restrict__ step_rows,    // (R,): rows of the step
                                       int* __restrict__ slots,              // (R, n)
                                       int* __restrict__ overflow,           // (1,): tokens refused
                                       int n, int max_pages, int page_size)
{
    const int r = blockIdx.x;
    const int row = step_rows[r];
    const int L = lengths[row];  // every thread reads the length before the step ...
    __shared__ int missing;
    if (threadIdx.x == 0) missing = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int pos = L + i;
        const int p = pos / page_size;
        const int page = p < max_pages ? block_table[(size_t)row * max_pages + p] : -1;
        if (page < 0) atomicAdd(&missing, 1);
    }
    __syncthreads();  // ... and all know whether every new token has a page
    const bool ok = missing == 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int pos = L + i;
        const int p = pos / page_size;
        slots[(size_t)r * n + i] =
            ok ? block_table[(size_t)row * max_pages + p] * page_size + pos % page_size : -1;
    }
    if (threadIdx.x == 0) {
        if (ok) lengths[row] = L + n;
        else atomicAdd(overflow, n);
    }
}

// new K, V: (R, Hkv, n, row) through element strides given in 16-byte units (sR, sH, sN);
// the pools: (num_pages, Hkv, page_size, row), rows of `chunks` 16-byte pieces. One block
// per new token (blockIdx.x = r * n + i), its threads over the token's Hkv x chunks pieces:
// the token's slot and source offset are worked out once per block.
extern "C" __global__ void paged_append(const uint4* __restrict__ k_new,
                                        const uint4* __restrict__ v_new,
                                        uint4* __restrict__ k_pages,
                                        uint4* __restrict__ v_pages,
                                        const int* __restrict__ slots,  // (R, n)
                                        int n, int Hkv, int chunks, int page_size,
                                        long long ksR, long long ksH, long long ksN,
                                        long long vsR, long long vsH, long long vsN)
{
    const int t = blockIdx.x;
    const int slot = slots[t];
    if (slot < 0) return;
    const long long r = t / n, i = t % n;
    const long long page = slot / page_size, off = slot % page_size;
    const uint4* k_src = k_new + r * ksR + i * ksN;
    const uint4* v_src = v_new + r * vsR + i * vsN;
    uint4* k_dst = k_pages + (page * Hkv * page_size + off) * chunks;
    uint4* v_dst = v_pages + (page * Hkv * page_size + off) * chunks;
    const long long head = (long long)page_size * chunks;  // one head's rows in a page
    for (int j = threadIdx.x; j < Hkv * chunks; j += blockDim.x) {
        const int h = j / chunks, c = j % chunks;
        k_dst[h * head + c] = k_src[h * ksH + c];
        v_dst[h * head + c] = v_src[h * vsH + c];
    }
}
