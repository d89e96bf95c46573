// multi_kernel: several kernels of one module, and the runtime calls around module globals:
//  - a template kernel instantiated for float and int;
//  - __constant__ memory written with cudaMemcpyToSymbol (also at an offset) and read back
//    with cudaMemcpyFromSymbol;
//  - __device__ globals: a counter reset with cudaMemcpyToSymbol, bumped with atomicAdd, read
//    back with cudaMemcpyFromSymbol, and an array read through cudaGetSymbolAddress;
//  - a struct passed by value, and a kernel with parameters of mixed sizes and alignments;
//  - dynamic shared memory (extern __shared__), also above 48 KiB after
//    cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize);
//  - atomicAdd reductions (int, exact; float, order-dependent) with warp shuffles;
//  - cudaFuncGetAttributes.
//
//   nvcc -O2 -o multi_kernel multi_kernel.cu && ./multi_kernel
//
// Prints `CHECK <name> <values>` lines, then `PASS multi_kernel`, or `FAIL multi_kernel: why`
// and exit status 1.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "multi_kernel"
#include "check.h"

#define NPOLY 8

__constant__ float c_poly[NPOLY];       // polynomial coefficients, lowest degree first
__device__ int d_block_count;           // blocks that ran count_blocks
__device__ float d_table[4] = {1.0f, 2.0f, 4.0f, 8.0f};  // initialised by the module

struct Params {
    float scale;
    float offset;
    float limit;
    int mode;  // 0: clamp(x * scale + offset), 1: |x| * scale + offset
};

// ---- kernels

template <typename T>
__global__ void axpy(T a, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void poly_eval(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i], acc = c_poly[NPOLY - 1];
#pragma unroll
        for (int k = NPOLY - 2; k >= 0; --k) acc = acc * v + c_poly[k];
        y[i] = acc;
    }
}

__global__ void count_blocks(float *out, int n) {
    if (threadIdx.x == 0) atomicAdd(&d_block_count, 1);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = d_table[i & 3];
}

__global__ void apply_params(Params p, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = p.mode == 0 ? x[i] * p.scale + p.offset : fabsf(x[i]) * p.scale + p.offset;
        y[i] = fminf(fmaxf(v, -p.limit), p.limit);
    }
}

// Parameters of sizes 1, 8, 2, 8 (pointer), 8, 4, 1: each lands at its own alignment.
__global__ void mixed_params(char c, double d, short s, double *out, long long ll, float f,
                             unsigned char u) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        out[0] = c;
        out[1] = d;
        out[2] = s;
        out[3] = (double)ll;
        out[4] = f;
        out[5] = u;
    }
}

// Each block stages `per_block` elements in dynamic shared memory, then reduces them with a
// tree over a second dynamic array of blockDim.x floats (blockDim.x a power of two).
__global__ void block_sum(const float *x, float *partials, int n, int per_block) {
    extern __shared__ float smem[];
    float *tile = smem;
    float *red = smem + per_block;
    const int base = blockIdx.x * per_block;
    for (int j = threadIdx.x; j < per_block; j += blockDim.x)
        tile[j] = base + j < n ? x[base + j] : 0.0f;
    __syncthreads();
    float acc = 0.0f;
    for (int j = threadIdx.x; j < per_block; j += blockDim.x) acc += tile[j];
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) red[threadIdx.x] += red[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = red[0];
}

// Sums ints (exact) and floats (order may vary) with warp shuffles and one atomicAdd per warp.
__global__ void atomic_sums(const int *xi, const float *xf, int n, int *sum_i, float *sum_f,
                            unsigned int *positives) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int vi = i < n ? xi[i] : 0;
    float vf = i < n ? xf[i] : 0.0f;
    unsigned int pos = (i < n && xi[i] > 0) ? 1u : 0u;
    for (int off = 16; off > 0; off >>= 1) {
        vi += __shfl_down_sync(0xffffffffu, vi, off);
        vf += __shfl_down_sync(0xffffffffu, vf, off);
        pos += __shfl_down_sync(0xffffffffu, pos, off);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(sum_i, vi);
        atomicAdd(sum_f, vf);
        atomicAdd(positives, pos);
    }
}

// ---- host

static float xval(int i) { return (float)((i * 29) % 1999) / 1999.0f * 2.0f - 1.0f; }

int main() {
    CK(cudaSetDevice(0));
    const int n = 1 << 20;
    const int threads = 256, blocks = (n + threads - 1) / threads;
    std::vector<float> hx(n), hy(n), out(n);
    std::vector<int> hxi(n), hyi(n), outi(n);
    for (int i = 0; i < n; ++i) {
        hx[i] = xval(i);
        hy[i] = xval(i + 7) * 0.5f;
        hxi[i] = (i * 7919) % 101 - 50;
        hyi[i] = (i % 13) - 6;
    }
    float *dx, *dy;
    int *dxi, *dyi;
    CK(cudaMalloc(&dx, n * sizeof(float)));
    CK(cudaMalloc(&dy, n * sizeof(float)));
    CK(cudaMalloc(&dxi, n * sizeof(int)));
    CK(cudaMalloc(&dyi, n * sizeof(int)));
    CK(cudaMemcpy(dx, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, hy.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxi, hxi.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dyi, hyi.data(), n * sizeof(int), cudaMemcpyHostToDevice));

    // -- template kernel, float and int
    axpy<float><<<blocks, threads>>>(2.5f, dx, dy, n);
    CK_LAUNCH();
    axpy<int><<<blocks, threads>>>(-3, dxi, dyi, n);
    CK_LAUNCH();
    CK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(outi.data(), dyi, n * sizeof(int), cudaMemcpyDeviceToHost));
    double fsum = 0;
    long long isum = 0;
    for (int i = 0; i < n; ++i) {
        const float ref = 2.5f * hx[i] + hy[i];
        EXPECT(std::fabs(out[i] - ref) <= 1e-6f * (std::fabs(ref) + 1.0f),
               "axpy<float>[%d] = %.9g, expected %.9g", i, out[i], ref);
        EXPECT(outi[i] == -3 * hxi[i] + hyi[i], "axpy<int>[%d] = %d, expected %d", i, outi[i],
               -3 * hxi[i] + hyi[i]);
        fsum += out[i];
        isum += outi[i];
    }
    printf("CHECK axpy_float %.6e %.6e\n", fsum, out[n / 3]);
    printf("CHECK axpy_int %lld %d\n", isum, outi[n / 3]);

    // -- __constant__ memory
    float coeffs[NPOLY] = {0.5f, -1.0f, 0.25f, 2.0f, -0.125f, 0.0625f, -0.75f, 0.3f};
    CK(cudaMemcpyToSymbol(c_poly, coeffs, sizeof(coeffs)));
    // Overwrite coefficient 3 alone, through the offset argument.
    coeffs[3] = 1.5f;
    CK(cudaMemcpyToSymbol(c_poly, &coeffs[3], sizeof(float), 3 * sizeof(float),
                          cudaMemcpyHostToDevice));
    float back[NPOLY];
    CK(cudaMemcpyFromSymbol(back, c_poly, sizeof(back)));
    for (int k = 0; k < NPOLY; ++k)
        EXPECT(back[k] == coeffs[k], "c_poly[%d] reads back %.9g, wrote %.9g", k, back[k],
               coeffs[k]);
    poly_eval<<<blocks, threads>>>(dx, dy, n);
    CK_LAUNCH();
    CK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    double psum = 0;
    for (int i = 0; i < n; ++i) {
        double ref = coeffs[NPOLY - 1];
        for (int k = NPOLY - 2; k >= 0; --k) ref = ref * hx[i] + coeffs[k];
        EXPECT(std::fabs(out[i] - ref) <= 1e-5 * (std::fabs(ref) + 1.0),
               "poly_eval[%d] = %.9g, expected %.9g", i, out[i], ref);
        psum += out[i];
    }
    printf("CHECK poly_sum %.6e\n", psum);

    // -- __device__ globals
    int start = 1000;
    CK(cudaMemcpyToSymbol(d_block_count, &start, sizeof(int)));
    count_blocks<<<blocks, threads>>>(dy, n);
    CK_LAUNCH();
    int counted = 0;
    CK(cudaMemcpyFromSymbol(&counted, d_block_count, sizeof(int)));
    EXPECT(counted == start + blocks, "d_block_count = %d, expected %d", counted, start + blocks);
    CK(cudaMemcpy(out.data(), dy, 16 * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 16; ++i)
        EXPECT(out[i] == (float)(1 << (i & 3)), "count_blocks out[%d] = %g", i, out[i]);
    void *table_addr = nullptr;
    size_t table_size = 0;
    CK(cudaGetSymbolAddress(&table_addr, d_table));
    CK(cudaGetSymbolSize(&table_size, d_table));
    EXPECT(table_size == 4 * sizeof(float), "cudaGetSymbolSize(d_table) = %zu", table_size);
    float table[4];
    CK(cudaMemcpy(table, table_addr, sizeof(table), cudaMemcpyDeviceToHost));
    EXPECT(table[0] == 1.0f && table[3] == 8.0f, "d_table reads %g %g %g %g", table[0], table[1],
           table[2], table[3]);
    printf("CHECK device_globals %d %.6e\n", counted, (double)table[3]);

    // -- struct by value
    Params p = {1.75f, -0.2f, 1.1f, 0};
    for (int mode = 0; mode < 2; ++mode) {
        p.mode = mode;
        apply_params<<<blocks, threads>>>(p, dx, dy, n);
        CK_LAUNCH();
        CK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
        double s = 0;
        for (int i = 0; i < n; ++i) {
            float v = mode == 0 ? hx[i] * p.scale + p.offset
                                : std::fabs(hx[i]) * p.scale + p.offset;
            v = std::fmin(std::fmax(v, -p.limit), p.limit);
            EXPECT(std::fabs(out[i] - v) <= 1e-6f,
                   "apply_params mode %d [%d] = %.9g, expected %.9g", mode, i, out[i], v);
            s += out[i];
        }
        printf("CHECK struct_param_mode%d %.6e\n", mode, s);
    }

    // -- mixed parameter sizes
    double *dmixed;
    CK(cudaMalloc(&dmixed, 6 * sizeof(double)));
    CK(cudaMemset(dmixed, 0, 6 * sizeof(double)));
    mixed_params<<<1, 32>>>((char)-7, 3.141592653589793, (short)-31000, dmixed,
                            1234567890123LL, 2.5f, (unsigned char)200);
    CK_LAUNCH();
    double mixed[6];
    CK(cudaMemcpy(mixed, dmixed, sizeof(mixed), cudaMemcpyDeviceToHost));
    const double mixed_ref[6] = {-7, 3.141592653589793, -31000, 1234567890123.0, 2.5, 200};
    for (int k = 0; k < 6; ++k)
        EXPECT(mixed[k] == mixed_ref[k], "mixed_params out[%d] = %.17g, expected %.17g", k,
               mixed[k], mixed_ref[k]);
    printf("CHECK mixed_params %.6e %.6e %.6e\n", mixed[1], mixed[2], mixed[3]);
    CK(cudaFree(dmixed));

    // -- dynamic shared memory: 2048 floats per block (9 KiB), then 16384 (65 KiB, above the
    // default 48 KiB limit, so the kernel must opt in first)
    double ref_total = 0;
    for (int i = 0; i < n; ++i) ref_total += hx[i];
    const int per_block_sizes[2] = {2048, 16384};
    for (int t = 0; t < 2; ++t) {
        const int per_block = per_block_sizes[t];
        const int nblocks = (n + per_block - 1) / per_block;
        const size_t shmem = (per_block + threads) * sizeof(float);
        if (shmem > 48 * 1024)
            CK(cudaFuncSetAttribute(block_sum, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)shmem));
        float *dpart;
        CK(cudaMalloc(&dpart, nblocks * sizeof(float)));
        block_sum<<<nblocks, threads, shmem>>>(dx, dpart, n, per_block);
        CK_LAUNCH();
        std::vector<float> part(nblocks);
        CK(cudaMemcpy(part.data(), dpart, nblocks * sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaFree(dpart));
        double total = 0;
        for (float v : part) total += v;
        EXPECT(std::fabs(total - ref_total) <= 1e-3 * (1.0 + std::fabs(ref_total)),
               "block_sum(%d per block) = %.9g, expected %.9g", per_block, total, ref_total);
        printf("CHECK block_sum_%d %.6e %.6e\n", per_block, total, (double)part[1]);
    }

    // -- atomicAdd reductions
    int *dsum_i;
    float *dsum_f;
    unsigned int *dpos;
    CK(cudaMalloc(&dsum_i, sizeof(int)));
    CK(cudaMalloc(&dsum_f, sizeof(float)));
    CK(cudaMalloc(&dpos, sizeof(unsigned int)));
    CK(cudaMemset(dsum_i, 0, sizeof(int)));
    CK(cudaMemset(dsum_f, 0, sizeof(float)));
    CK(cudaMemset(dpos, 0, sizeof(unsigned int)));
    atomic_sums<<<blocks, threads>>>(dxi, dx, n, dsum_i, dsum_f, dpos);
    CK_LAUNCH();
    int got_i = 0;
    float got_f = 0;
    unsigned int got_pos = 0;
    CK(cudaMemcpy(&got_i, dsum_i, sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&got_f, dsum_f, sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&got_pos, dpos, sizeof(unsigned int), cudaMemcpyDeviceToHost));
    long long ref_i = 0;
    unsigned int ref_pos = 0;
    for (int i = 0; i < n; ++i) {
        ref_i += hxi[i];
        ref_pos += hxi[i] > 0;
    }
    EXPECT(got_i == ref_i, "atomic int sum %d, expected %lld", got_i, ref_i);
    EXPECT(got_pos == ref_pos, "atomic positives %u, expected %u", got_pos, ref_pos);
    // Float atomics in arbitrary order over 2^20 values of magnitude <= 1.
    EXPECT(std::fabs(got_f - ref_total) <= 0.05 + 1e-4 * std::fabs(ref_total),
           "atomic float sum %.9g, expected %.9g", got_f, ref_total);
    printf("CHECK atomic_int %d %u\n", got_i, got_pos);
    printf("atomic float sum %.6e (order-dependent, not compared)\n", got_f);
    CK(cudaFree(dsum_i));
    CK(cudaFree(dsum_f));
    CK(cudaFree(dpos));

    // -- function attributes (informational: registers depend on the compiler)
    cudaFuncAttributes attr;
    CK(cudaFuncGetAttributes(&attr, block_sum));
    printf("block_sum: %d registers, %zu bytes static shared, max %d threads per block\n",
           attr.numRegs, attr.sharedSizeBytes, attr.maxThreadsPerBlock);
    EXPECT(attr.maxThreadsPerBlock >= threads, "block_sum maxThreadsPerBlock %d",
           attr.maxThreadsPerBlock);
    CK(cudaFuncGetAttributes(&attr, axpy<int>));

    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dxi));
    CK(cudaFree(dyi));
    printf("PASS " PROG "\n");
    return 0;
}
