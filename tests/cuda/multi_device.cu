// multi_device: every device the program sees (through rgpu: every GPU of every server in
// RGPU_SERVERS) runs the same work; data moves between devices through the host. Checks that
// device pointers of different devices never coincide, so a copy finds its device.
//
//   nvcc -O2 -o multi_device multi_device.cu && ./multi_device
//
// Prints `devices N`, `CHECK` lines that do not depend on N, then `PASS multi_device`.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "multi_device"
#include "check.h"

__global__ void scale_add(const float *in, float *out, float factor, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = in[i] * factor + (float)(i % 7);
}

int main() {
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    printf("devices %d\n", count);
    const int n = 1 << 22;
    std::vector<float> host(n), back(n);
    for (int i = 0; i < n; i++) host[i] = (float)((i * 37) % 1001) / 1000.0f;

    std::vector<float *> in(count), out(count);
    for (int d = 0; d < count; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&in[d], n * sizeof(float)));
        CK(cudaMalloc(&out[d], n * sizeof(float)));
    }
    // The allocations of all devices are distinct address ranges.
    for (int a = 0; a < 2 * count; a++)
        for (int b = a + 1; b < 2 * count; b++) {
            char *pa = (char *)(a % 2 ? out[a / 2] : in[a / 2]);
            char *pb = (char *)(b % 2 ? out[b / 2] : in[b / 2]);
            if (pa < pb + n * sizeof(float) && pb < pa + n * sizeof(float)) {
                printf("FAIL " PROG ": allocations %d and %d overlap (%p, %p)\n", a, b, pa, pb);
                return 1;
            }
        }
    // Device 0 computes from the host data; each next device computes from the previous
    // device's result, carried through the host.
    std::vector<float> current = host;
    for (int d = 0; d < count; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMemcpy(in[d], current.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        scale_add<<<264, 256>>>(in[d], out[d], 0.5f, n);
        CK(cudaGetLastError());
        CK(cudaMemcpy(back.data(), out[d], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++) {
            float want = current[i] * 0.5f + (float)(i % 7);
            if (back[i] != want) {
                printf("FAIL " PROG ": device %d element %d = %g, want %g\n", d, i, back[i], want);
                return 1;
            }
        }
        current = back;
    }
    // Device 0's result again, read after every device has worked (its memory is intact).
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(back.data(), out[0], n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += back[i];
    printf("CHECK device0_sum %.6e\n", sum);
    printf("CHECK device0_elems %.6e %.6e\n", back[1], back[n - 1]);
    for (int d = 0; d < count; d++) {
        CK(cudaSetDevice(d));
        CK(cudaFree(in[d]));
        CK(cudaFree(out[d]));
    }
    printf("PASS " PROG "\n");
    return 0;
}
