// version 2: fp32, 8 warps that pass the score tile to each other through shared memory.
//
// What changes from version 1: a thread block of 256 threads (8 warps) owns
// Br = 64 query rows and builds the whole score tile S_ij (Br x Bc, Bc = 64) in
// shared memory together. Q_i stays in shared memory for the block's lifetime,
// K_j and V_j are staged once per tile and now serve 64 rows instead of 32.
// Each of the three steps of a tile is spread over all 256 threads:
//   1. S = scale * Q_i K_j^T: each thread computes a 4 x 4 block of S (rows
//      ty + 16a, columns tx + 16b) from 4 values of Q and 4 of K held in
//      registers: 16 FMAs per 8 shared-memory loads, where version 1 had one
//      load per FMA;
//   2. online softmax: 4 threads per row find the row maximum and sum with two
//      warp shuffles, write P back over S, and record m, l and the correction
//      alpha = exp(m_old - m_new) per row in shared memory;
//   3. O = alpha * O + P V_j: each thread owns a 4 x (D/16) block of O in
//      registers (rows ty + 16a, columns tx + 16b), again reusing each loaded
//      P and V value 4 or D/16 times.
// The loop over query tiles is FlashAttention-2's order, but the work inside a block is
// not FlashAttention-2's split: no warp owns its rows from start to end. Step 2 reads
// scores that other warps wrote in step 1, step 3 reads the P and alpha of step 2, so
// S, P, m, l and alpha pass between warps through shared memory, with a barrier
// (__syncthreads) between the steps. That exchange is the cost FlashAttention-2 removed
// from FlashAttention-1, whose warps split K and V and combined their partial results
// through shared memory. FlashAttention-2's split, each warp owning its own query rows so
// that nothing is exchanged, first appears in version 3.
// Padding: rows of Q_i, K_j and S are padded by one float, meant to keep the column
// walks of steps 1 and 2 free of bank conflicts; the profile still counts many
// conflicts (it does not say which accesses make them).
// What the counters show against version 1: about as many instructions, issued far
// more often (a larger share of the issue slots busy), with more warps resident per SM.
//
// Measured: see the recorded run (results/gpu_bench.json, results/gpu_profile.json), printed
// by chapter 5; this comment holds no numbers, so it cannot disagree with them.
//
// Compiled at run time by NVRTC with -DHEAD_DIM=<d> (1 <= d <= 128); no headers.

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D HEAD_DIM
#define Br 64
#define Bc 64
#define NTHREADS 256
#define RA (Br / 16)          // rows of S and O per thread
#define CB (Bc / 16)          // columns of S per thread
#define OB ((D + 15) / 16)    // columns of O per thread
#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void __launch_bounds__(NTHREADS)
flash_v2(const float* __restrict__ Q,  // (B*H, Nq, D)
         const float* __restrict__ K,  // (B*H, Nk, D)
         const float* __restrict__ V,  // (B*H, Nk, D)
         float* __restrict__ O,        // (B*H, Nq, D)
         float* __restrict__ lse,      // (B*H, Nq)
         int Nq, int Nk, float scale, int causal)
{
    extern __shared__ float smem[];
    float* Qs = smem;                      // (Br, D+1)
    float* Ks = Qs + Br * (D + 1);         // (Bc, D+1)
    float* Vs = Ks + Bc * (D + 1);         // (Bc, D)
    float* Ss = Vs + Bc * D;               // (Br, Bc+1): S, then P
    float* m_s = Ss + Br * (Bc + 1);       // (Br,) running max
    float* l_s = m_s + Br;                 // (Br,) running sum
    float* a_s = l_s + Br;                 // (Br,) this tile's correction factor

    const int tid = threadIdx.x;
    const int ty = tid / 16, tx = tid % 16;
    const int bh = blockIdx.y;
    const int q0 = blockIdx.x * Br;
    const float* Qb = Q + (size_t)bh * Nq * D;
    const float* Kb = K + (size_t)bh * Nk * D;
    const float* Vb = V + (size_t)bh * Nk * D;

    for (int i = tid; i < Br * D; i += NTHREADS) {
        int r = i / D, c = i % D;
        Qs[r * (D + 1) + c] = (q0 + r < Nq) ? Qb[(size_t)(q0 + r) * D + c] : 0.f;
    }
    if (tid < Br) {
        m_s[tid] = NEG_INF;
        l_s[tid] = 0.f;
    }
    float o[RA][OB];
#pragma unroll
    for (int a = 0; a < RA; a++)
#pragma unroll
        for (int b = 0; b < OB; b++) o[a][b] = 0.f;

    const int kv_end = causal ? min(Nk, q0 + Br) : Nk;
    for (int c0 = 0; c0 < kv_end; c0 += Bc) {
        __syncthreads();  // the previous tile (K, V, P) is no longer being read
        for (int i = tid; i < Bc * D; i += NTHREADS) {
            int r = i / D, c = i % D;
            bool ok = c0 + r < Nk;
            Ks[r * (D + 1) + c] = ok ? Kb[(size_t)c0 * D + i] : 0.f;
            Vs[i] = ok ? Vb[(size_t)c0 * D + i] : 0.f;
        }
        __syncthreads();

        // 1. S = scale * Q_i K_j^T, a 4 x 4 register block per thread
        float acc[RA][CB];
#pragma unroll
        for (int a = 0; a < RA; a++)
#pragma unroll
            for (int b = 0; b < CB; b++) acc[a][b] = 0.f;
        for (int x = 0; x < D; x++) {
            float q[RA], k[CB];
#pragma unroll
            for (int a = 0; a < RA; a++) q[a] = Qs[(ty + 16 * a) * (D + 1) + x];
#pragma unroll
            for (int b = 0; b < CB; b++) k[b] = Ks[(tx + 16 * b) * (D + 1) + x];
#pragma unroll
            for (int a = 0; a < RA; a++)
#pragma unroll
                for (int b = 0; b < CB; b++) acc[a][b] += q[a] * k[b];
        }
#pragma unroll
        for (int a = 0; a < RA; a++) {
            int row = q0 + ty + 16 * a;
#pragma unroll
            for (int b = 0; b < CB; b++) {
                int col = c0 + tx + 16 * b;
                bool masked = col >= Nk || (causal && col > row);
                Ss[(ty + 16 * a) * (Bc + 1) + tx + 16 * b] = masked ? NEG_INF : acc[a][b] * scale;
            }
        }
        __syncthreads();

        // 2. online softmax: the 4 neighbouring lanes tid = 4r .. 4r+3 share row r
        {
            const int r = tid / 4, part = tid % 4;
            float* Srow = Ss + r * (Bc + 1);
            float m_old = m_s[r];
            float mx = NEG_INF;
#pragma unroll
            for (int j = part; j < Bc; j += 4) mx = fmaxf(mx, Srow[j]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(m_old, mx);
            float m_use = (m_new == NEG_INF) ? 0.f : m_new;  // nothing seen yet: shift by 0
            float sum = 0.f;
#pragma unroll
            for (int j = part; j < Bc; j += 4) {
                float p = __expf(Srow[j] - m_use);
                Srow[j] = p;
                sum += p;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            __syncwarp();  // every lane of the row has read m_s[r] before it changes
            if (part == 0) {
                float alpha = __expf(m_old - m_use);
                a_s[r] = alpha;
                l_s[r] = alpha * l_s[r] + sum;
                m_s[r] = m_new;
            }
        }
        __syncthreads();

        // 3. O = alpha * O + P V_j, a 4 x (D/16) register block per thread
        float alpha[RA];
#pragma unroll
        for (int a = 0; a < RA; a++) alpha[a] = a_s[ty + 16 * a];
#pragma unroll
        for (int a = 0; a < RA; a++)
#pragma unroll
            for (int b = 0; b < OB; b++) o[a][b] *= alpha[a];
        for (int c = 0; c < Bc; c++) {
            float p[RA], v[OB];
#pragma unroll
            for (int a = 0; a < RA; a++) p[a] = Ss[(ty + 16 * a) * (Bc + 1) + c];
#pragma unroll
            for (int b = 0; b < OB; b++) v[b] = (tx + 16 * b < D) ? Vs[c * D + tx + 16 * b] : 0.f;
#pragma unroll
            for (int a = 0; a < RA; a++)
#pragma unroll
                for (int b = 0; b < OB; b++) o[a][b] += p[a] * v[b];
        }
    }
    __syncthreads();  // m_s and l_s from the last tile are visible to every thread

#pragma unroll
    for (int a = 0; a < RA; a++) {
        int r = ty + 16 * a;
        if (q0 + r >= Nq) continue;
        float l = l_s[r];
        float inv = (l > 0.f) ? 1.f / l : 0.f;  // a row that saw no key gets zeros
        float* Ob = O + ((size_t)bh * Nq + q0 + r) * D;
#pragma unroll
        for (int b = 0; b < OB; b++)
            if (tx + 16 * b < D) Ob[tx + 16 * b] = o[a][b] * inv;
    }
    if (tid < Br && q0 + tid < Nq) {
        float l = l_s[tid];
        lse[(size_t)bh * Nq + q0 + tid] = (l > 0.f) ? m_s[tid] + logf(l) : NEG_INF;
    }
}
