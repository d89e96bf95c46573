// streams_events: 4 non-blocking streams, each copying its chunk in (pinned memory), running a
// kernel and copying out; events carry dependencies between streams (cudaEventRecord +
// cudaStreamWaitEvent), timing events (cudaEventElapsedTime), cudaEventQuery polling,
// cudaEventSynchronize, cudaStreamQuery, cudaDeviceSynchronize.
//
//   nvcc -O2 -o streams_events streams_events.cu && ./streams_events
//
// Prints `CHECK <name> <values>` lines (never the time), then `PASS streams_events`, or
// `FAIL streams_events: why` and exit status 1.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "streams_events"
#include "check.h"

#define NSTREAMS 4
#define ITERS 64

// The per-element work of stage 1, shared by the kernel and the CPU reference.
__host__ __device__ inline float stage1(float x) {
    float v = x;
    for (int r = 0; r < ITERS; ++r) v = v * 0.999f + 0.001f * x;
    return v;
}

// Stage 1, on each stream's own chunk: y = stage1(x).
__global__ void stage1_kernel(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = stage1(x[i]);
}

// Stage 2, after the previous stream's stage 1: z = y_own + 0.5 * y_prev.
__global__ void stage2_kernel(const float *y_own, const float *y_prev, float *z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = y_own[i] + 0.5f * y_prev[i];
}

int main() {
    CK(cudaSetDevice(0));
    const int chunk = 1 << 20;  // elements per stream
    const int n = chunk * NSTREAMS;
    const size_t bytes = (size_t)n * sizeof(float);

    float *hx, *hy, *hz;
    CK(cudaMallocHost(&hx, bytes));
    CK(cudaMallocHost(&hy, bytes));
    CK(cudaMallocHost(&hz, bytes));
    for (int i = 0; i < n; ++i) hx[i] = (float)((i * 13) % 997) / 997.0f - 0.25f;
    float *dx, *dy, *dz;
    CK(cudaMalloc(&dx, bytes));
    CK(cudaMalloc(&dy, bytes));
    CK(cudaMalloc(&dz, bytes));

    cudaStream_t s[NSTREAMS];
    cudaEvent_t stage1_done[NSTREAMS], all_done[NSTREAMS];
    for (int i = 0; i < NSTREAMS; ++i) {
        CK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
        // Dependency-only events: no timing.
        CK(cudaEventCreateWithFlags(&stage1_done[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&all_done[i], cudaEventDisableTiming));
    }
    cudaEvent_t start, stop;
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));

    // Stream 0 records the start; the other streams wait for it so the timing covers them.
    CK(cudaEventRecord(start, s[0]));
    const int threads = 256, blocks = (chunk + threads - 1) / threads;
    for (int i = 0; i < NSTREAMS; ++i) {
        const size_t off = (size_t)i * chunk;
        if (i > 0) CK(cudaStreamWaitEvent(s[i], start, 0));
        CK(cudaMemcpyAsync(dx + off, hx + off, chunk * sizeof(float), cudaMemcpyHostToDevice,
                           s[i]));
        stage1_kernel<<<blocks, threads, 0, s[i]>>>(dx + off, dy + off, chunk);
        CK(cudaGetLastError());
        CK(cudaEventRecord(stage1_done[i], s[i]));
    }
    // Each stream's stage 2 reads the previous stream's stage-1 output: wait for its event.
    for (int i = 0; i < NSTREAMS; ++i) {
        const int prev = (i + NSTREAMS - 1) % NSTREAMS;
        const size_t off = (size_t)i * chunk, prev_off = (size_t)prev * chunk;
        CK(cudaStreamWaitEvent(s[i], stage1_done[prev], 0));
        stage2_kernel<<<blocks, threads, 0, s[i]>>>(dy + off, dy + prev_off, dz + off, chunk);
        CK(cudaGetLastError());
        CK(cudaMemcpyAsync(hy + off, dy + off, chunk * sizeof(float), cudaMemcpyDeviceToHost,
                           s[i]));
        CK(cudaMemcpyAsync(hz + off, dz + off, chunk * sizeof(float), cudaMemcpyDeviceToHost,
                           s[i]));
        CK(cudaEventRecord(all_done[i], s[i]));
    }
    // Stream 0 joins the others, then records the stop.
    for (int i = 1; i < NSTREAMS; ++i) CK(cudaStreamWaitEvent(s[0], all_done[i], 0));
    CK(cudaEventRecord(stop, s[0]));

    // While work may be in flight, cudaStreamQuery answers success or not-ready, nothing else.
    for (int i = 0; i < NSTREAMS; ++i) {
        cudaError_t q = cudaStreamQuery(s[i]);
        if (q != cudaSuccess && q != cudaErrorNotReady) CK(q);
    }
    // Poll the stop event until it completes.
    long polls = 0;
    cudaError_t q;
    while ((q = cudaEventQuery(stop)) == cudaErrorNotReady) ++polls;
    CK(q);
    printf("stop event complete after %ld polls\n", polls);
    CK(cudaEventSynchronize(stop));  // already complete: returns at once
    // Every stream's work precedes the stop, so every stream is idle now.
    for (int i = 0; i < NSTREAMS; ++i) {
        CK(cudaStreamQuery(s[i]));
        CK(cudaEventQuery(all_done[i]));
    }
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, start, stop));
    printf("elapsed %.3f ms (not compared)\n", ms);
    CK(cudaDeviceSynchronize());

    // CPU reference.
    std::vector<float> ry(n);
    for (int i = 0; i < n; ++i) ry[i] = stage1(hx[i]);
    double ysum = 0, zsum = 0;
    for (int i = 0; i < n; ++i) {
        const int prev_i = (i - chunk + n) % n;  // same position in the previous chunk
        const float rz = ry[i] + 0.5f * ry[prev_i];
        if (std::fabs(hy[i] - ry[i]) > 1e-5f * (std::fabs(ry[i]) + 1.0f) ||
            std::fabs(hz[i] - rz) > 2e-5f * (std::fabs(rz) + 1.0f)) {
            printf("FAIL " PROG ": element %d: y %.9g (expected %.9g), z %.9g (expected %.9g)\n",
                   i, hy[i], ry[i], hz[i], rz);
            return 1;
        }
        ysum += hy[i];
        zsum += hz[i];
    }
    printf("CHECK y_sum %.6e\n", ysum);
    printf("CHECK z_sum %.6e\n", zsum);
    for (int i = 0; i < NSTREAMS; ++i) {
        const size_t at = (size_t)i * chunk + 777;
        printf("CHECK chunk%d %.6e %.6e\n", i, hy[at], hz[at]);
    }

    for (int i = 0; i < NSTREAMS; ++i) {
        CK(cudaEventDestroy(stage1_done[i]));
        CK(cudaEventDestroy(all_done[i]));
        CK(cudaStreamDestroy(s[i]));
    }
    CK(cudaEventDestroy(start));
    CK(cudaEventDestroy(stop));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dz));
    CK(cudaFreeHost(hx));
    CK(cudaFreeHost(hy));
    CK(cudaFreeHost(hz));
    printf("PASS " PROG "\n");
    return 0;
}
