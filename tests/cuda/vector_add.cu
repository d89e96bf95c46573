// vector_add: the basic runtime path. cudaGetDeviceCount/Properties, cudaMalloc, cudaMemset,
// cudaMemcpy both ways, a grid-stride kernel, cudaFree. 16M floats.
//
//   nvcc -O2 -o vector_add vector_add.cu && ./vector_add
//
// Prints `CHECK <name> <values>` lines (compared between a native run and one through rgpu by
// compare.py), then `PASS vector_add`, or `FAIL vector_add: why` and exit status 1.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define PROG "vector_add"
#include "check.h"

static void fail(const char *why) {
    printf("FAIL " PROG ": %s\n", why);
    fflush(stdout);
    exit(1);
}

__global__ void add(const float *a, const float *b, float *c, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        c[i] = a[i] + b[i];
}

__global__ void scale_inplace(float *c, float s, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) c[i] *= s;
}

int main() {
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    if (count < 1) fail("no CUDA device");
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s, %d SMs, cc %d.%d, %.1f GiB\n", prop.name, prop.multiProcessorCount,
           prop.major, prop.minor, prop.totalGlobalMem / 1073741824.0);
    printf("CHECK sm_count %d\n", prop.multiProcessorCount);
    printf("CHECK compute_capability %d %d\n", prop.major, prop.minor);
    printf("CHECK warp_size %d\n", prop.warpSize);

    const size_t n = (size_t)1 << 24;
    const size_t bytes = n * sizeof(float);
    std::vector<float> a(n), b(n), c(n);
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i % 1000) * 0.001f;
        b[i] = (float)((i * 7) % 1013) * 0.5f - 100.0f;
    }

    float *da, *db, *dc;
    CK(cudaMalloc(&da, bytes));
    CK(cudaMalloc(&db, bytes));
    CK(cudaMalloc(&dc, bytes));

    // cudaMemset: every byte 0x3f, so every float reads 0x3f3f3f3f.
    CK(cudaMemset(dc, 0x3f, bytes));
    CK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
    uint32_t pattern;
    for (size_t i = 0; i < n; i += 4097) {
        memcpy(&pattern, &c[i], 4);
        if (pattern != 0x3f3f3f3fu) fail("cudaMemset pattern not read back");
    }
    memcpy(&pattern, &c[n - 1], 4);
    if (pattern != 0x3f3f3f3fu) fail("cudaMemset pattern not read back (last element)");

    CK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
    add<<<prop.multiProcessorCount * 8, 256>>>(da, db, dc, n);
    CK_LAUNCH();
    CK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));

    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        float ref = a[i] + b[i];
        if (c[i] != ref) {
            printf("FAIL " PROG ": c[%zu] = %.9g, expected %.9g\n", i, c[i], ref);
            return 1;
        }
        sum += c[i];
    }
    printf("CHECK add_sum %.6e\n", sum);
    printf("CHECK add_elems %.6e %.6e %.6e\n", c[0], c[n / 2 + 3], c[n - 1]);

    // A second kernel with one block per 256 elements, then a partial copy back at an offset.
    scale_inplace<<<(unsigned)((n + 255) / 256), 256>>>(dc, 0.5f, n);
    CK_LAUNCH();
    const size_t off = 12345, part = 1 << 20;
    std::vector<float> p(part);
    CK(cudaMemcpy(p.data(), dc + off, part * sizeof(float), cudaMemcpyDeviceToHost));
    double psum = 0;
    for (size_t i = 0; i < part; i++) {
        float ref = (a[off + i] + b[off + i]) * 0.5f;
        if (p[i] != ref) {
            printf("FAIL " PROG ": scaled c[%zu] = %.9g, expected %.9g\n", off + i, p[i], ref);
            return 1;
        }
        psum += p[i];
    }
    printf("CHECK scaled_part_sum %.6e\n", psum);

    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    printf("PASS " PROG "\n");
    return 0;
}
