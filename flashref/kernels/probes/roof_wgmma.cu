// Microbenchmark: the wgmma roof, the peak rate of Hopper's warpgroup matrix instruction
// wgmma.mma_async m64n256k16 (fp16 inputs, fp32 accumulate), both operands in shared memory.
// Needs sm_90a (compile with -arch=sm_90a).
//
// Each block is two warpgroups (256 threads); each warpgroup issues ITERS x 4 wgmma on a
// 64 x 64 tile of A and a 256 x 64 tile of B filled with random 16-bit values (not zeros),
// described by shared-memory matrix descriptors in the no-swizzle layout: core matrices of
// 8 rows x 16 bytes, LBO = 128 bytes between the two core matrices along K of one
// instruction, SBO = 256 bytes between core matrices along M (or N). The values and their
// layout do not matter for the rate, only that every access is a legal shared address.
// FLOPs = blocks x 2 x ITERS x 4 x 2 x 64 x 256 x 16.
typedef unsigned short half_t;
typedef unsigned int u32;
typedef unsigned long long u64;

// matrix descriptor: start address, leading and stride byte offsets, no swizzle (bits 62-63 = 0)
__device__ __forceinline__ u64 desc(u32 saddr, u32 lbo, u32 sbo)
{
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wgmma_m64n256k16(float* d, u64 da, u64 db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db));
}

extern "C" __global__ void __launch_bounds__(256)
roof_wgmma(const half_t* __restrict__ in,  // (20480,) random fp16 bits for the two tiles
           float* __restrict__ out,        // (gridDim.x * 256,) keeps the results alive
           int iters)
{
    __shared__ alignas(1024) half_t sA[64 * 64];   // 8 KB
    __shared__ alignas(1024) half_t sB[256 * 64];  // 32 KB
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) sA[i] = in[i];
    for (int i = threadIdx.x; i < 256 * 64; i += blockDim.x) sB[i] = in[4096 + i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // st.shared -> async proxy
    __syncthreads();
    const u32 a0 = (u32)__cvta_generic_to_shared(sA), b0 = (u32)__cvta_generic_to_shared(sB);
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; i++) d[i] = 0.f;
    for (int it = 0; it < iters; it++) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int k = 0; k < 4; k++)  // one 16-wide slice of K per instruction
            wgmma_m64n256k16(d, desc(a0 + k * 2048, 128, 256), desc(b0 + k * 8192, 128, 256));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 128; i++) sum += d[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
