// Shared by the Hopper (sm_90a) kernels: the PTX of Hopper's own instructions, each wrapped
// once, with the data layout it assumes. Include it after mma_common.cuh (which gives half_t,
// u32, MMA_AB and pack_half2); compile for sm_90a (NVRTC: -arch=sm_90a; nvcc: -arch=sm_90a).
//
//   wgmma          one warpgroup (4 consecutive warps, 128 threads, the first warp's index a
//                  multiple of 4) computes D (64 x N, fp32) += A (64 x 16) B (16 x N),
//                  asynchronously; B always from shared memory, A from shared memory (SS) or
//                  from registers (RS)
//   descriptors    64-bit words that tell wgmma where an operand lies in shared memory and in
//                  which layout (here: the 128-byte swizzle)
//   mbarrier       a 64-bit shared-memory barrier with a phase bit and a count of bytes still
//                  to arrive, which TMA copies decrement when they land
//   TMA            cp.async.bulk.tensor: the copy engine moves a whole box of a 2-D tensor
//                  from global to shared memory, swizzling it on the way
//   fences         fence.proxy.async orders ordinary shared-memory stores before wgmma or TMA
//                  reads of the same bytes (they go through the "async proxy")
//   setmaxnreg     moves registers between warpgroups of one block
//
// The layouts are checked on the CPU by flashref/hardware/hopper.py's models (tests/hardware/test_hopper_model.py)
// and on an H200 by flashref/kernels/probes/probe_wgmma.cu (tests/gpu/test_hopper_probe.py).
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
#error "hopper_common.cuh: wgmma, TMA and setmaxnreg need a Hopper target: compile with -arch=sm_90a"
#endif
#ifndef MMA_AB
#error "hopper_common.cuh: include mma_common.cuh first (half_t, u32, MMA_AB, pack_half2)"
#endif

typedef unsigned long long u64;

// ---- the 128-byte swizzle ------------------------------------------------------------------
// A tile of 16-bit elements with 64 columns: each row is 128 bytes, eight 16-byte chunks. In
// the 128-byte swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B, wgmma's layout type 1), chunk j of
// row r is stored at chunk j ^ (r % 8) of that row: byte offset of element (r, c)
//   r * 128 + (((c / 8) ^ (r % 8)) * 16) + (c % 8) * 2
// The pattern repeats every 8 rows (1024 bytes); the tile's base must be 1024-byte aligned.
// (The hardware XORs address bits 4-6 with bits 7-9, so this holds for the absolute address.)
// flashref.hardware.hopper.swizzle128_offset is the same formula, tested on the CPU.
__device__ __forceinline__ u32 swizzle128(int r, int c)
{
    return r * 128 + (((c >> 3) ^ (r & 7)) << 4) + (c & 7) * 2;
}

// ---- shared-memory matrix descriptors (PTX ISA: "Matrix Descriptor Format") ----------------
//   bits  0-13  start address >> 4        bits 16-29  leading dimension byte offset (LBO) >> 4
//   bits 32-45  stride dimension byte offset (SBO) >> 4
//   bits 49-51  base offset (0: every tile here starts 1024-byte aligned)
//   bits 62-63  swizzle mode: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
__device__ __forceinline__ u64 desc_sw128(u32 saddr, u32 lbo, u32 sbo)
{
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16)
           | ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// K-major operand (Q as A, K as B of S = Q K^T: rows of 64 elements along k, 128 bytes each,
// in the 128-byte swizzle). One instruction reads 16 k (32 bytes) of every row, inside one
// swizzled row, so LBO is not used (set to 16 bytes, encoded 1); SBO = 1024 bytes from one
// group of 8 rows to the next. The k-th 16-wide slice starts 32 k bytes after the tile: the
// hardware applies the XOR to the address it computes, so the start moves within the atom.
__device__ __forceinline__ u64 desc_kmajor_sw128(u32 tile, int kstep)
{
    return desc_sw128(tile + 32 * kstep, 16, 1024);
}

// MN-major B operand (V of O = P V, stored as V[key][d]: rows of 64 d along n, 128 bytes,
// swizzled), read with imm-trans-b = 1. One instruction reads 16 keys: two groups of 8 rows,
// SBO = 1024 bytes apart; LBO = the bytes from one 64-wide block of n to the next (d = 128 is
// two TMA boxes of 64 columns, lbo = 64 * 64 * 2 = 8192). The kk-th 16-key slice starts
// 16 * 128 = 2048 kk bytes after the tile. The same descriptor serves an MN-major A, read
// with imm-trans-a = 1, m in place of n (dS^T[key][query] of the backward's dQ = dS K).
__device__ __forceinline__ u64 desc_mnmajor_sw128(u32 tile, int kstep, u32 lbo)
{
    return desc_sw128(tile + 2048 * kstep, lbo, 1024);
}

// ---- wgmma: issue, commit, wait --------------------------------------------------------------
// wgmma_fence before the first wgmma that reads registers written by ordinary instructions
// (the accumulators, or A fragments); commit closes a group of issued wgmma; wait<N> blocks
// until at most N groups are still running. All are executed by the whole warpgroup.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }

// Accumulators are written by the tensor cores behind the compiler's back: after wgmma_wait,
// pass them through this empty asm so no read of them is moved above the wait.
template <int R>
__device__ __forceinline__ void wgmma_fence_acc(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}

// ---- wgmma.mma_async m64nNk16, f32 += f16 * f16 (bf16 * bf16 with -DFLASHREF_BF16) -----------
// Accumulator layout (PTX ISA: "Matrix Fragments for wgmma.m64nNk16", flashref.hardware.hopper
// .wgmma_c): warp w = (threadIdx.x % 128) / 32 holds rows 16 w .. 16 w + 15; inside them it has
// the mma.sync m16n8k16 C layout once per 8 columns: with g = lane / 4, t = lane % 4,
//   d[4 j + 0], d[4 j + 1]: D[16 w + g][8 j + 2 t, + 1]
//   d[4 j + 2], d[4 j + 3]: D[16 w + g + 8][8 j + 2 t, + 1]          (N / 2 floats per thread)
// A from registers (RS): warp w holds rows 16 w .. 16 w + 15 of A (64 x 16) in the mma.sync
// A layout: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, +9], a3 = A[g+8][2t+8, +9]
// (pairs in one register, the first in the low 16 bits). Packing accumulator columns 16 kk .. 16
// kk + 15 of S in pairs gives exactly P's A fragments for k-slice kk (a_from_c in fragments.py):
//   a0 = pack(d[8 kk + 0], d[8 kk + 1])  a1 = pack(d[8 kk + 2], d[8 kk + 3])
//   a2 = pack(d[8 kk + 4], d[8 kk + 5])  a3 = pack(d[8 kk + 6], d[8 kk + 7])
// scale_d = 0 ignores the old D (D = A B), 1 accumulates. TRANS_B = 0: B is K-major (K of S),
// 1: B is MN-major (V of O = P V; allowed for 16-bit types).
#define WG_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_ACC32(i) WG_ACC4(i), WG_ACC4(i + 4), WG_ACC4(i + 8), WG_ACC4(i + 12), \
    WG_ACC4(i + 16), WG_ACC4(i + 20), WG_ACC4(i + 24), WG_ACC4(i + 28)
#define WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
    "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
    "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
    "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, " \
    "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_TYPES ".f32." MMA_AB "." MMA_AB " "

// SS: A and B from shared memory (descriptors da, db). TRANS_A = 0: A is K-major (Q of
// S = Q K^T: rows of A along k); 1: A is MN-major, stored as A^T[k][m] with rows of 64 m along
// m (dS of the backward's dQ = dS K, kept as dS^T[key][query]); allowed for 16-bit types. Its
// descriptor is the MN-major one below (desc_mnmajor_sw128: SBO from one group of 8 k-rows to
// the next, the kk-th 16-wide k slice 2048 kk bytes on; m = 64 is one 64-wide block, so LBO
// is not used).
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16" WG_TYPES WG_D32
                 ", %32, %33, p, 1, 1, %36, %35;\n}\n"
                 : WG_ACC32(0) : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B), "n"(TRANS_A));
}
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], u64 da, u64 db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16" WG_TYPES WG_D64
                 ", %64, %65, p, 1, 1, %68, %67;\n}\n"
                 : WG_ACC32(0), WG_ACC32(32)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B), "n"(TRANS_A));
}

// RS: A from registers a0..a3 (layout above), B from shared memory (descriptor db)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], u32 a0, u32 a1, u32 a2, u32 a3, u64 db,
                                             int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16" WG_TYPES WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : WG_ACC32(0)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d), "n"(TRANS_B));
}
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, u64 db,
                                              int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16" WG_TYPES WG_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : WG_ACC32(0), WG_ACC32(32)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d), "n"(TRANS_B));
}

// ---- mbarrier (PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier") --
// A barrier completes a phase when `count` arrivals have happened AND the transaction count
// (bytes announced by arrive_expect_tx) has dropped to zero; then its phase bit flips and it
// rearms. A waiter passes the parity of the phase it waits for: 0 for the first completion,
// 1 for the second, and so on alternately. init by one thread, then fence + __syncthreads
// before anyone else touches it.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
// makes the initialised barrier visible to the async proxy (TMA's complete_tx)
__device__ __forceinline__ void mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// one arrival, announcing that `bytes` more will land by complete_tx
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
// spins until the phase of parity `parity` has completed (try_wait may return false after a
// time-out chosen by the hardware; the loop asks again)
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity)
{
    u32 done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
// mbar_wait for a thread that waits long and has nothing else to do (a producer whose ring is
// full): try_wait's optional suspendTimeHint lets the hardware suspend the thread until the
// phase completes or about `suspend_ns` nanoseconds have passed, instead of the thread asking
// again and again and taking issue slots from the warps beside it. Same result as mbar_wait.
__device__ __forceinline__ void mbar_wait_suspend(u32 bar, u32 parity, u32 suspend_ns)
{
    u32 done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity), "r"(suspend_ns) : "memory");
}

// ---- TMA: cp.async.bulk.tensor (PTX ISA: "Data Movement: cp.async.bulk.tensor") --------------
// The tensor map (made on the host by cuTensorMapEncodeTiled, flashref.gpu.tma.tensor_map)
// reaches the kernel as a `const __grid_constant__ TensorMap` parameter; its generic address
// is passed here. One thread issues the copy of the box whose top-left element is at column
// c0, row c1 (innermost coordinate first) to shared address dst (1024-byte aligned for the
// 128-byte swizzle); when its bytes have landed they are subtracted from bar's transaction
// count. Elements outside the tensor are filled with zeros (and still counted).
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap* map, int c0, int c1, u32 bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// ---- fences and register reallocation --------------------------------------------------------
// Shared memory written by ordinary stores and then read by wgmma or TMA (the async proxy):
// each writing thread executes this before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// setmaxnreg: the executing warpgroup's per-thread register budget becomes N (24..256, a
// multiple of 8). Takes effect only with a register cap at entry (__launch_bounds__(T, 1));
// producers dec, consumers inc, each role in one branch of an if/else.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }

// ---- named barriers (PTX ISA: "Parallel Synchronization and Communication Instructions: bar,
// barrier") ------------------------------------------------------------------------------------
// A block has 16 hardware barriers, id 0 to 15; __syncthreads uses id 0, so pass another id.
// bar.sync id, n: this thread's warp arrives at barrier id and waits until n threads in all
// have arrived (n a multiple of 32: warps count whole); bar.arrive id, n: the warp arrives and
// goes on without waiting. When the count reaches n the barrier releases its waiters and starts
// again from zero. Both are the .aligned forms: every thread of a warp executes the same one,
// so call them warp-uniformly (here: warpgroup-uniformly). Two warpgroups pass a turn with
// n = 256: one waits with bar.sync (its 128 threads) until the other's bar.arrive (128) comes.
__device__ __forceinline__ void named_bar_sync(u32 id, u32 nthreads)
{
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(u32 id, u32 nthreads)
{
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(nthreads) : "memory");
}
