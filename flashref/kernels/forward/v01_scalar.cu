// version 1: scalar fp32, one thread per query row.
//
// The design of the well-known ~100-line tutorial kernel, made correct for every
// shape: a thread block of Br = 32 threads owns Br query rows; each thread keeps
// its row's running state (m, l and the unnormalised output o[D]) in registers
// and walks the key tiles. The block stages K_j, V_j (Bc = 32 keys) in shared
// memory so that each key is read from HBM once per block, not once per thread.
// Rows of Q_i and S are padded by one float so that 32 threads reading 32
// different rows at the same column hit 32 different banks.
// Bounds: keys >= Nk are -inf, rows >= Nq are computed on zeros and not written;
// causal (top-left) masks key j > query i and stops at the block's last query.
//
// What limits it: every score is a dot product done by one thread (no reuse of
// a loaded value across rows in registers), and each thread does 2*D FMAs per
// key with one (P V) or two (Q K^T) shared-memory loads per FMA. Plain fp32 FMA.
// What the counters show: few warps resident per SM (a block is a single warp, and the
// shared memory of each block caps how many fit), most issue slots idle, and warps
// stalled on memory results (long and short scoreboard) and on fixed-latency
// dependencies (wait) far more often than they issue.
//
// Measured: see the recorded run (results/gpu_bench.json, results/gpu_profile.json), printed
// by chapter 5; this comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d>; no headers are included.

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define Br 32
#define Bc 32
#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void __launch_bounds__(Br)
flash_v1(const float* __restrict__ Q,  // (B*H, Nq, D)
         const float* __restrict__ K,  // (B*H, Nk, D)
         const float* __restrict__ V,  // (B*H, Nk, D)
         float* __restrict__ O,        // (B*H, Nq, D)
         float* __restrict__ lse,      // (B*H, Nq)
         int Nq, int Nk, float scale, int causal)
{
    extern __shared__ float smem[];
    float* Qs = smem;                  // (Br, D+1)
    float* Ks = Qs + Br * (D + 1);     // (Bc, D)
    float* Vs = Ks + Bc * D;           // (Bc, D)
    float* Ss = Vs + Bc * D;           // (Br, Bc+1)

    const int tx = threadIdx.x;
    const int bh = blockIdx.y;
    const int q0 = blockIdx.x * Br;
    const int row = q0 + tx;
    const float* Qb = Q + (size_t)bh * Nq * D;
    const float* Kb = K + (size_t)bh * Nk * D;
    const float* Vb = V + (size_t)bh * Nk * D;

    for (int i = tx; i < Br * D; i += Br) {  // coalesced: consecutive threads, consecutive floats
        int r = i / D, c = i % D;
        Qs[r * (D + 1) + c] = (q0 + r < Nq) ? Qb[(size_t)(q0 + r) * D + c] : 0.f;
    }

    float o[D];
#pragma unroll
    for (int x = 0; x < D; x++) o[x] = 0.f;
    float m = NEG_INF, l = 0.f;

    const int kv_end = causal ? min(Nk, q0 + Br) : Nk;  // later keys are masked for every row here
    for (int c0 = 0; c0 < kv_end; c0 += Bc) {
        __syncthreads();  // the previous tile is no longer being read
        for (int i = tx; i < Bc * D; i += Br) {
            int r = i / D;
            bool ok = c0 + r < Nk;
            Ks[i] = ok ? Kb[(size_t)c0 * D + i] : 0.f;
            Vs[i] = ok ? Vb[(size_t)c0 * D + i] : 0.f;
        }
        __syncthreads();

        // S_ij for this thread's row: Bc scores, and their maximum
        float m_tile = NEG_INF;
        for (int y = 0; y < Bc; y++) {
            int col = c0 + y;
            float s = NEG_INF;
            if (col < Nk && !(causal && col > row)) {
                float acc = 0.f;
#pragma unroll
                for (int x = 0; x < D; x++) acc += Qs[tx * (D + 1) + x] * Ks[y * D + x];
                s = acc * scale;
            }
            Ss[tx * (Bc + 1) + y] = s;
            m_tile = fmaxf(m_tile, s);
        }

        // online softmax: rescale the old state to the new maximum, add this tile
        float m_new = fmaxf(m, m_tile);
        float m_use = (m_new == NEG_INF) ? 0.f : m_new;  // nothing seen yet: shift by 0, not -inf
        float alpha = __expf(m - m_use);
        float rowsum = 0.f;
#pragma unroll
        for (int x = 0; x < D; x++) o[x] *= alpha;
        for (int y = 0; y < Bc; y++) {
            float p = __expf(Ss[tx * (Bc + 1) + y] - m_use);
            rowsum += p;
#pragma unroll
            for (int x = 0; x < D; x++) o[x] += p * Vs[y * D + x];
        }
        l = alpha * l + rowsum;
        m = m_new;
    }

    if (row < Nq) {
        float inv = (l > 0.f) ? 1.f / l : 0.f;  // a row that saw no key gets zeros
        float* Ob = O + ((size_t)bh * Nq + row) * D;
#pragma unroll
        for (int x = 0; x < D; x++) Ob[x] = o[x] * inv;
        lse[(size_t)bh * Nq + row] = (l > 0.f) ? m + logf(l) : NEG_INF;
    }
}
