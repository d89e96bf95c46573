// matmul_shared: a tiled SGEMM (16x16 tiles in shared memory, __syncthreads) on a square
// 1024^3 problem, a non-square 1024x768 * 768x512 one and an odd-sized one whose edges are
// partial tiles. A CPU reference (double) checks a subset of the rows.
//
//   nvcc -O2 -o matmul_shared matmul_shared.cu && ./matmul_shared
//
// Prints `CHECK <name> <values>` lines, then `PASS matmul_shared`, or `FAIL matmul_shared: why`
// and exit status 1.
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "matmul_shared"
#include "check.h"

#define TILE 16

// C[M x N] = A[M x K] * B[K x N], row-major.
__global__ void matmul_tiled(const float *A, const float *B, float *C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        const int ka = t * TILE + tx;  // column of A this thread loads
        const int kb = t * TILE + ty;  // row of B this thread loads
        As[ty][tx] = (row < M && ka < K) ? A[(size_t)row * K + ka] : 0.0f;
        Bs[ty][tx] = (kb < K && col < N) ? B[(size_t)kb * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}

// Deterministic pseudo-random values in [-1, 1).
static void fill(std::vector<float> &v, uint32_t seed) {
    uint32_t s = seed;
    for (auto &x : v) {
        s = s * 1664525u + 1013904223u;
        x = (float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
    }
}

// Runs one M x K * K x N product on the GPU, checks every `row_step`-th row (and the last) on
// the CPU, prints its CHECK lines. Returns false on a mismatch.
static bool run_case(const char *name, int M, int N, int K, int row_step, uint32_t seed) {
    std::vector<float> A((size_t)M * K), B((size_t)K * N), C((size_t)M * N);
    fill(A, seed);
    fill(B, seed * 31u + 7u);

    float *dA, *dB, *dC;
    CK(cudaMalloc(&dA, A.size() * sizeof(float)));
    CK(cudaMalloc(&dB, B.size() * sizeof(float)));
    CK(cudaMalloc(&dC, C.size() * sizeof(float)));
    CK(cudaMemcpy(dA, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(dC, 0, C.size() * sizeof(float)));

    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_tiled<<<grid, block>>>(dA, dB, dC, M, N, K);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(C.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost));

    // CPU reference in double, row by row (i-k-j order keeps B's rows streaming): every
    // `row_step`-th row and the last one.
    std::vector<int> rows;
    for (int i = 0; i < M; i += row_step) rows.push_back(i);
    if (rows.back() != M - 1) rows.push_back(M - 1);
    std::vector<double> ref(N), mag(N);
    double max_err = 0;
    for (int i : rows) {
        std::fill(ref.begin(), ref.end(), 0.0);
        std::fill(mag.begin(), mag.end(), 0.0);
        for (int k = 0; k < K; ++k) {
            const double a = A[(size_t)i * K + k];
            const float *brow = &B[(size_t)k * N];
            for (int j = 0; j < N; ++j) {
                ref[j] += a * brow[j];
                mag[j] += std::fabs(a * brow[j]);
            }
        }
        for (int j = 0; j < N; ++j) {
            const double got = C[(size_t)i * N + j];
            const double err = std::fabs(got - ref[j]);
            // float accumulation over K terms (FMA or not): the error is bounded by about
            // K*eps*sum|a*b| and in practice is ~eps*sum|a*b|; allow 2e-5 of the magnitude sum.
            if (err > 2e-5 * mag[j] + 1e-6) {
                printf("FAIL " PROG ": %s C[%d][%d] = %.9g, expected %.9g (err %.3g)\n", name, i,
                       j, got, ref[j], err);
                return false;
            }
            if (err > max_err) max_err = err;
        }
    }
    const int checked_rows = (int)rows.size();

    double sum = 0, asum = 0;
    for (float x : C) {
        sum += x;
        asum += std::fabs(x);
    }
    printf("%s: %dx%d * %dx%d, %d rows checked on the CPU, max abs error %.3g\n", name, M, K, K,
           N, checked_rows, max_err);
    printf("CHECK %s_sum %.6e %.6e\n", name, sum, asum);
    printf("CHECK %s_elems %.6e %.6e %.6e\n", name, C[0], C[(size_t)(M / 2) * N + N / 3],
           C[C.size() - 1]);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    return true;
}

int main() {
    CK(cudaSetDevice(0));
    if (!run_case("square", 1024, 1024, 1024, 8, 1)) return 1;
    if (!run_case("rect", 1024, 512, 768, 8, 2)) return 1;
    if (!run_case("odd", 333, 129, 257, 1, 3)) return 1;
    printf("PASS " PROG "\n");
    return 0;
}
