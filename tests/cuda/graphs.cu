// graphs: CUDA graphs by stream capture. A stream's work (a memset, kernels, a device-to-device
// copy) is captured, instantiated once and launched many times; capture state is queried while
// capturing; host<->device copies and a host function captured into a graph, launched with
// new host input each time. Checks the results against the CPU.
//
//   nvcc -O2 -o graphs graphs.cu && ./graphs
//
// Prints `CHECK` lines, then `PASS graphs`, or `FAIL graphs: why` and exit status 1.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "graphs"
#include "check.h"

__global__ void affine(float *x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + b;
}

__global__ void add_into(const float *src, float *dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

static void CUDART_CB count_call(void *data) { ++*static_cast<int *>(data); }

int main() {
    const int n = 1 << 18, launches = 20, threads = 256, blocks = (n + threads - 1) / threads;
    std::vector<float> host(n), back(n);
    for (int i = 0; i < n; ++i) host[i] = (float)(i % 97) / 97.0f;

    float *x, *y, *acc;
    CK(cudaMalloc(&x, n * sizeof(float)));
    CK(cudaMalloc(&y, n * sizeof(float)));
    CK(cudaMalloc(&acc, n * sizeof(float)));
    CK(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(acc, 0, n * sizeof(float)));

    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CK(cudaStreamIsCapturing(stream, &capture));
    EXPECT(capture == cudaStreamCaptureStatusNone, "capturing before the capture began");

    // One step: y = x; y = 0.5 y + 1; acc += y; x = y.
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CK(cudaStreamIsCapturing(stream, &capture));
    EXPECT(capture == cudaStreamCaptureStatusActive, "not capturing after cudaStreamBeginCapture");
    unsigned long long capture_id = 0;
    CK(cudaStreamGetCaptureInfo(stream, &capture, &capture_id));
    EXPECT(capture == cudaStreamCaptureStatusActive && capture_id != 0, "capture info %d %llu",
           (int)capture, capture_id);
    CK(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    affine<<<blocks, threads, 0, stream>>>(y, 0.5f, 1.0f, n);
    add_into<<<blocks, threads, 0, stream>>>(y, acc, n);
    CK(cudaMemcpyAsync(x, y, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaStreamIsCapturing(stream, &capture));
    EXPECT(capture == cudaStreamCaptureStatusNone, "still capturing after cudaStreamEndCapture");

    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphUpload(exec, stream));
    for (int k = 0; k < launches; ++k) CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back.data(), acc, n * sizeof(float), cudaMemcpyDeviceToHost));

    double sum = 0;
    for (int i = 0; i < n; ++i) {
        float v = host[i], want = 0.0f;
        for (int k = 0; k < launches; ++k) {
            v = 0.5f * v + 1.0f;
            want += v;
        }
        EXPECT(std::abs(back[i] - want) <= 1e-4f * want, "element %d = %g, want %g", i, back[i],
               want);
        sum += back[i];
    }
    printf("CHECK graph_sum %.6e\n", sum);
    printf("CHECK graph_elems %.6e %.6e\n", back[0], back[n - 1]);

    // Host<->device copies captured into a graph (pinned and pageable host memory): each launch
    // reads the host input as it is then, and writes the host output.
    const int m = 100000;
    float *pinned_in, *pinned_out;
    CK(cudaMallocHost(&pinned_in, m * sizeof(float)));
    CK(cudaMallocHost(&pinned_out, m * sizeof(float)));
    std::vector<float> pageable_out(m);
    cudaGraph_t io;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(y, pinned_in, m * sizeof(float), cudaMemcpyHostToDevice, stream));
    affine<<<(m + threads - 1) / threads, threads, 0, stream>>>(y, 3.0f, 1.0f, m);
    CK(cudaMemcpyAsync(pinned_out, y, m * sizeof(float), cudaMemcpyDeviceToHost, stream));
    affine<<<(m + threads - 1) / threads, threads, 0, stream>>>(y, 1.0f, 1.0f, m);
    CK(cudaMemcpyAsync(pageable_out.data(), y, m * sizeof(float), cudaMemcpyDeviceToHost, stream));
    int host_calls = 0;
    CK(cudaLaunchHostFunc(stream, count_call, &host_calls));
    CK(cudaStreamEndCapture(stream, &io));
    cudaGraphExec_t io_exec;
    CK(cudaGraphInstantiate(&io_exec, io, 0));
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < m; ++i) pinned_in[i] = float(i % 13 + round);
        CK(cudaGraphLaunch(io_exec, stream));
        CK(cudaStreamSynchronize(stream));
        for (int i = 0; i < m; ++i) {
            float want = 3.0f * float(i % 13 + round) + 1.0f;
            EXPECT(pinned_out[i] == want && pageable_out[i] == want + 1.0f,
                   "captured host copies, round %d, element %d: %g %g, want %g", round, i,
                   pinned_out[i], pageable_out[i], want);
        }
    }
    EXPECT(host_calls == 3, "captured host function ran %d times in 3 launches", host_calls);
    printf("CHECK captured_host_copies %.6e %.6e %d\n", pinned_out[m - 1], pageable_out[m - 1],
           host_calls);
    CK(cudaGraphExecDestroy(io_exec));
    CK(cudaGraphDestroy(io));
    CK(cudaFreeHost(pinned_in));
    CK(cudaFreeHost(pinned_out));

    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(stream));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(acc));
    printf("PASS " PROG "\n");
    return 0;
}
