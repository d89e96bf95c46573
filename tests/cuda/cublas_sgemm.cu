// cublas_sgemm: cuBLAS through the runtime: cublasCreate, cublasSetStream, cublasSetMathMode,
// cublasSetMatrix/cublasGetMatrix, cublasSgemm (512x384x256, B transposed, alpha and beta),
// cublasSgemmStridedBatched (4 small products), cublasDestroy. CPU references in double.
//
//   nvcc -O2 -o cublas_sgemm cublas_sgemm.cu -lcublas && ./cublas_sgemm
//
// Prints `CHECK <name> <values>` lines, then `PASS cublas_sgemm`, or `FAIL cublas_sgemm: why`
// and exit status 1.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "cublas_sgemm"
#include "check.h"
#define CKB(call)                                                                         \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            printf("FAIL " PROG ": %s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call,      \
                   (int)s_, cublasGetStatusString(s_));                                   \
            fflush(stdout);                                                               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

// Deterministic pseudo-random values in [-1, 1).
static void fill(std::vector<float> &v, uint32_t seed) {
    uint32_t s = seed;
    for (auto &x : v) {
        s = s * 1664525u + 1013904223u;
        x = (float)((s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
    }
}

// |got - ref| within 2e-5 of sum|terms| (float accumulation) plus a small absolute slack.
static bool close_enough(double got, double ref, double mag) {
    return std::fabs(got - ref) <= 2e-5 * mag + 1e-6;
}

int main() {
    CK(cudaSetDevice(0));
    cublasHandle_t h;
    CKB(cublasCreate(&h));
    int version = 0;
    CKB(cublasGetVersion(h, &version));
    printf("cuBLAS version %d\n", version);
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    CKB(cublasSetStream(h, stream));
    CKB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));  // plain FP32, no TF32

    // ---- C = alpha * A * B^T + beta * C, column-major: A is M x K, B is N x K, C is M x N.
    const int M = 512, N = 384, K = 256;
    const float alpha = 1.5f, beta = -0.5f;
    std::vector<float> A((size_t)M * K), B((size_t)N * K), C0((size_t)M * N), C((size_t)M * N);
    fill(A, 11);
    fill(B, 22);
    fill(C0, 33);
    float *dA, *dB, *dC;
    CK(cudaMalloc(&dA, A.size() * sizeof(float)));
    CK(cudaMalloc(&dB, B.size() * sizeof(float)));
    CK(cudaMalloc(&dC, C.size() * sizeof(float)));
    CKB(cublasSetMatrix(M, K, sizeof(float), A.data(), M, dA, M));
    CK(cudaMemcpy(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C0.data(), C0.size() * sizeof(float), cudaMemcpyHostToDevice));
    CKB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, M, N, K, &alpha, dA, M, dB, N, &beta, dC, M));
    CK(cudaStreamSynchronize(stream));
    CKB(cublasGetMatrix(M, N, sizeof(float), dC, M, C.data(), M));

    // Column by column, the inner loop running down contiguous columns of A.
    double sum = 0, max_err = 0;
    std::vector<double> acc(M), mag(M);
    for (int j = 0; j < N; ++j) {
        std::fill(acc.begin(), acc.end(), 0.0);
        std::fill(mag.begin(), mag.end(), 0.0);
        for (int k = 0; k < K; ++k) {
            const double b = B[j + (size_t)k * N];
            const float *acol = &A[(size_t)k * M];
            for (int i = 0; i < M; ++i) {
                acc[i] += acol[i] * b;
                mag[i] += std::fabs(acol[i] * b);
            }
        }
        for (int i = 0; i < M; ++i) {
            const double c0 = C0[i + (size_t)j * M];
            const double ref = alpha * acc[i] + beta * c0;
            const double got = C[i + (size_t)j * M];
            if (!close_enough(got, ref, std::fabs(alpha) * mag[i] + std::fabs(beta * c0))) {
                printf("FAIL " PROG ": sgemm C(%d,%d) = %.9g, expected %.9g\n", i, j, got, ref);
                return 1;
            }
            if (std::fabs(got - ref) > max_err) max_err = std::fabs(got - ref);
            sum += got;
        }
    }
    printf("sgemm %dx%dx%d: max abs error %.3g\n", M, N, K, max_err);
    printf("CHECK sgemm_sum %.6e\n", sum);
    printf("CHECK sgemm_elems %.6e %.6e %.6e\n", C[0], C[(size_t)M * N / 2 + 5], C[C.size() - 1]);

    // ---- strided batched: C_b = 0.75 * A_b * B_b (beta 0), 4 products of 64x32 * 32x48.
    const int bm = 64, bn = 48, bk = 32, batch = 4;
    const long long sa = (long long)bm * bk, sb = (long long)bk * bn, sc = (long long)bm * bn;
    const float balpha = 0.75f, bbeta = 0.0f;
    std::vector<float> BA(sa * batch), BB(sb * batch), BC(sc * batch);
    fill(BA, 44);
    fill(BB, 55);
    float *dBA, *dBB, *dBC;
    CK(cudaMalloc(&dBA, BA.size() * sizeof(float)));
    CK(cudaMalloc(&dBB, BB.size() * sizeof(float)));
    CK(cudaMalloc(&dBC, BC.size() * sizeof(float)));
    CK(cudaMemcpy(dBA, BA.data(), BA.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dBB, BB.data(), BB.size() * sizeof(float), cudaMemcpyHostToDevice));
    // beta is 0, so C's old contents must not matter: fill it with NaN bytes (0xff).
    CK(cudaMemset(dBC, 0xff, BC.size() * sizeof(float)));
    CKB(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, bm, bn, bk, &balpha, dBA, bm, sa,
                                  dBB, bk, sb, &bbeta, dBC, bm, sc, batch));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(BC.data(), dBC, BC.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int b = 0; b < batch; ++b) {
        double bsum = 0;
        for (int j = 0; j < bn; ++j)
            for (int i = 0; i < bm; ++i) {
                double acc = 0, mag = 0;
                for (int k = 0; k < bk; ++k) {
                    const double t =
                        (double)BA[b * sa + i + (size_t)k * bm] * BB[b * sb + k + (size_t)j * bk];
                    acc += t;
                    mag += std::fabs(t);
                }
                const double ref = balpha * acc;
                const double got = BC[b * sc + i + (size_t)j * bm];
                if (!close_enough(got, ref, balpha * mag)) {
                    printf("FAIL " PROG ": batched C_%d(%d,%d) = %.9g, expected %.9g\n", b, i, j,
                           got, ref);
                    return 1;
                }
                bsum += got;
            }
        printf("CHECK batched_%d %.6e %.6e\n", b, bsum, (double)BC[b * sc + 17]);
    }

    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    CK(cudaFree(dBA));
    CK(cudaFree(dBB));
    CK(cudaFree(dBC));
    CKB(cublasDestroy(h));
    CK(cudaStreamDestroy(stream));
    printf("PASS " PROG "\n");
    return 0;
}
