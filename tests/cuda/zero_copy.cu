// zero_copy: kernels that reach page-locked host memory directly (mapped, "zero-copy"
// memory), as NVIDIA's zero-copy sample, Numba's mapped arrays and XLA's timer use it:
// cudaHostAlloc(cudaHostAllocMapped) and cudaHostGetDevicePointer, a kernel reading the host's
// input and writing its output there, read after cudaDeviceSynchronize; the host pointer
// passed to a kernel as it is (unified addressing), on memory from cudaMallocHost; and a
// kernel that spins on a flag in pinned memory until the host releases it (XLA's delay
// kernel), which must see the release, not time out.
//
//   nvcc -O2 -o zero_copy zero_copy.cu && ./zero_copy
//
// Prints `CHECK <name> <values>` lines, then `PASS zero_copy`, or `FAIL zero_copy: why` and
// exit status 1.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

#define PROG "zero_copy"
#include "check.h"

__global__ void scale(const float *in, float *out, int n, float by) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * by + (float)i;
}

// Spins until *flag is 1 (the host's release) or about `cycles` clock cycles pass; records
// in *outcome 1 when released, 2 when it gave up.
__global__ void wait_for_release(volatile int *flag, int *outcome, long long cycles) {
    long long start = clock64();
    while (*flag != 1) {
        if (clock64() - start > cycles) {
            *outcome = 2;
            return;
        }
    }
    *outcome = 1;
}

int main() {
    const int n = 1 << 16;
    float *in = nullptr, *out = nullptr;
    CK(cudaHostAlloc((void **)&in, n * sizeof(float), cudaHostAllocMapped));
    CK(cudaHostAlloc((void **)&out, n * sizeof(float), cudaHostAllocMapped));
    for (int i = 0; i < n; ++i) {
        in[i] = (float)(i % 1000) * 0.5f;
        out[i] = -1.0f;
    }
    float *d_in = nullptr, *d_out = nullptr;
    CK(cudaHostGetDevicePointer((void **)&d_in, in, 0));
    CK(cudaHostGetDevicePointer((void **)&d_out, out, 0));
    scale<<<(n + 255) / 256, 256>>>(d_in, d_out, n, 3.0f);
    CK_LAUNCH();
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        EXPECT(out[i] == in[i] * 3.0f + (float)i, "mapped output %d is %f, not %f", i, out[i],
               in[i] * 3.0f + (float)i);
        sum += out[i];
    }
    printf("CHECK mapped %.6e %.6e\n", sum, (double)out[n - 1]);

    // The host changes its input; the next launch sees the change.
    for (int i = 0; i < n; ++i) in[i] = 1.0f;
    scale<<<(n + 255) / 256, 256>>>(d_in, d_out, n, 2.0f);
    CK_LAUNCH();
    EXPECT(out[10] == 12.0f, "after the host's change, out[10] is %f, not 12", out[10]);
    printf("CHECK mapped_again %.6e\n", (double)out[10]);

    // Pinned memory passed as it is (unified addressing).
    float *pinned = nullptr;
    CK(cudaMallocHost((void **)&pinned, n * sizeof(float)));
    for (int i = 0; i < n; ++i) pinned[i] = 2.0f;
    scale<<<(n + 255) / 256, 256>>>(pinned, pinned, n, 0.25f);
    CK_LAUNCH();
    EXPECT(pinned[7] == 0.5f + 7.0f, "pinned[7] is %f, not 7.5", pinned[7]);
    printf("CHECK unified %.6e\n", (double)pinned[n - 1]);

    // A kernel spinning on a host flag until the host releases it (about 2 s at most).
    int *flag = nullptr, *outcome = nullptr;
    CK(cudaHostAlloc((void **)&flag, sizeof(int), cudaHostAllocPortable));
    CK(cudaHostAlloc((void **)&outcome, sizeof(int), cudaHostAllocPortable));
    *flag = 0;
    *outcome = 0;
    cudaEvent_t done;
    CK(cudaEventCreate(&done));
    wait_for_release<<<1, 1>>>(flag, outcome, 4000000000LL);
    CK(cudaGetLastError());
    CK(cudaEventRecord(done, 0));
    *flag = 1;
    CK(cudaEventSynchronize(done));
    EXPECT(*outcome == 1, "the spinning kernel %s", *outcome == 2 ? "never saw the release" : "did not run");
    printf("CHECK released %d\n", *outcome);

    CK(cudaEventDestroy(done));
    CK(cudaFreeHost(flag));
    CK(cudaFreeHost(outcome));
    CK(cudaFreeHost(pinned));
    CK(cudaFreeHost(in));
    CK(cudaFreeHost(out));
    printf("PASS zero_copy\n");
    return 0;
}
