// large_copies: host<->device copies from 64 KiB to 48 MiB (plus odd sizes) from pageable and
// page-locked memory, synchronous and asynchronous, with a kernel between the two directions,
// and page-locked buffers reused after their copies complete. Through a server on this host
// these cross the shared-memory ring, and page-locked memory is copied in place.
//
//   nvcc -O2 -o large_copies large_copies.cu && ./large_copies
//
// Prints `CHECK <name> <values>` lines, then `PASS large_copies`, or `FAIL large_copies: why`.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define PROG "large_copies"
#include "check.h"

typedef unsigned char byte;

__global__ void add_index(byte *p, size_t n, int k) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = (byte)(p[i] + (i % 251) + k);
}

static byte pattern(size_t i, int seed) { return (byte)(i * 131 + (i >> 13) + seed * 17); }

static unsigned long long weighted(const byte *p, size_t n) {
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum += (unsigned long long)p[i] * (i % 1013 + 1);
    return sum;
}

// One round: host -> device, a kernel, device -> host; `pinned` picks the host memory,
// `async` the copy calls (on `stream`).
static void round_trip(size_t n, bool pinned, bool async, cudaStream_t stream, int seed) {
    byte *in, *out, *dev;
    if (pinned) {
        CK(cudaMallocHost(&in, n));
        CK(cudaHostAlloc(&out, n, cudaHostAllocDefault));
    } else {
        in = (byte *)malloc(n);
        out = (byte *)malloc(n);
    }
    CK(cudaMalloc(&dev, n));
    for (size_t i = 0; i < n; i++) in[i] = pattern(i, seed);
    memset(out, 0, n);
    int threads = 256;
    unsigned blocks = (unsigned)((n + threads - 1) / threads);
    if (async) {
        CK(cudaMemcpyAsync(dev, in, n, cudaMemcpyHostToDevice, stream));
        add_index<<<blocks, threads, 0, stream>>>(dev, n, seed);
        CK(cudaGetLastError());
        CK(cudaMemcpyAsync(out, dev, n, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
    } else {
        CK(cudaMemcpy(dev, in, n, cudaMemcpyHostToDevice));
        add_index<<<blocks, threads>>>(dev, n, seed);
        CK_LAUNCH();
        CK(cudaMemcpy(out, dev, n, cudaMemcpyDeviceToHost));
    }
    for (size_t i = 0; i < n; i++) {
        byte want = (byte)(pattern(i, seed) + (i % 251) + seed);
        EXPECT(out[i] == want, "%zu bytes %s %s: byte %zu is %u, want %u", n,
               pinned ? "pinned" : "pageable", async ? "async" : "sync", i, out[i], want);
    }
    // The same page-locked buffer again, refilled once its copy completed: the second copy
    // must carry the new contents.
    if (pinned && async) {
        for (size_t i = 0; i < n; i++) in[i] = pattern(i, seed + 1);
        CK(cudaMemcpyAsync(dev, in, n, cudaMemcpyHostToDevice, stream));
        CK(cudaMemcpyAsync(out, dev, n, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        EXPECT(memcmp(in, out, n) == 0, "%zu bytes: a reused page-locked buffer", n);
    }
    printf("CHECK %s_%s_%zu %llu\n", pinned ? "pinned" : "pageable", async ? "async" : "sync", n,
           weighted(out, n));
    CK(cudaFree(dev));
    if (pinned) {
        CK(cudaFreeHost(in));
        CK(cudaFreeHost(out));
    } else {
        free(in);
        free(out);
    }
}

int main() {
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    const size_t sizes[] = {64 << 10, (1 << 20) + 4097, 5 << 20, 48 << 20};
    int seed = 1;
    for (size_t n : sizes)
        for (int pinned = 0; pinned < 2; pinned++)
            for (int async = 0; async < 2; async++) round_trip(n, pinned, async, stream, seed++);
    // A copy into part of a page-locked allocation (an offset inside it).
    byte *pinned, *dev;
    const size_t n = 9 << 20;
    CK(cudaMallocHost(&pinned, 2 * n));
    CK(cudaMalloc(&dev, n));
    for (size_t i = 0; i < n; i++) pinned[i] = pattern(i, 99);
    CK(cudaMemcpyAsync(dev, pinned, n, cudaMemcpyHostToDevice, stream));
    CK(cudaMemcpyAsync(pinned + n + 8, dev, n - 8, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    EXPECT(memcmp(pinned, pinned + n + 8, n - 8) == 0, "a copy at an offset in pinned memory");
    printf("CHECK offset %llu\n", weighted(pinned + n + 8, n - 8));
    CK(cudaFree(dev));
    CK(cudaFreeHost(pinned));
    CK(cudaStreamDestroy(stream));
    printf("PASS large_copies\n");
    return 0;
}
