// ipc: CUDA IPC between two processes through the runtime API. The parent fills device memory,
// records an interprocess event after a slow kernel, and passes both handles to a child (this
// program run again, handles in hex on its command line). The child opens them
// (cudaIpcOpenMemHandle on the allocation's base; its own view of an offset into it), waits for
// the event on a stream, reads, writes back in place with a kernel, and closes the mapping;
// the parent then sees the child's writes. Also: the same allocation gives the same handle
// twice; closing an address that is no mapping, and a handle of memory that is not the
// device's, are errors. Last, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (the attribute programs set on
// memory they share): a synchronous cudaMemset of the allocation has finished when it
// returns, so a second child, ordered by nothing else, reads its zeros.
//
//   nvcc -O2 -o ipc ipc.cu -lcuda && ./ipc
//
// Prints `CHECK <name> <values>` lines, then `PASS ipc`, or `FAIL ipc: why` and exit status 1.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "ipc"
#include "check.h"

#define N (1 << 20)

__global__ void fill(float *x, int n, float scale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    // A slow start, so that the child's reads must wait for the event, not only luck.
    for (int spin = 0; spin < 2000 && i == 0; ++spin) __nanosleep(1000);
    if (i < n) x[i] = scale * (float)(i % 1000);
}

__global__ void add_one(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

static std::string to_hex(const void *bytes, size_t n) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < n; ++i) {
        unsigned char b = ((const unsigned char *)bytes)[i];
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

static void from_hex(const char *text, void *bytes, size_t n) {
    EXPECT(strlen(text) == 2 * n, "a handle of %zu hex digits", strlen(text));
    for (size_t i = 0; i < n; ++i) {
        unsigned v = 0;
        sscanf(text + 2 * i, "%2x", &v);
        ((unsigned char *)bytes)[i] = (unsigned char)v;
    }
}

static double sum_of(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += x[i];
    return s;
}

// The second child: opens the allocation and reads it at once (nothing orders the read after
// the parent's memset but SYNC_MEMOPS).
static int zeros_child(const char *mem_hex) {
    cudaIpcMemHandle_t mem;
    from_hex(mem_hex, &mem, sizeof mem);
    float *x = nullptr;
    CK(cudaIpcOpenMemHandle((void **)&x, mem, cudaIpcMemLazyEnablePeerAccess));
    float *host = (float *)malloc(N * sizeof(float));
    CK(cudaMemcpy(host, x, N * sizeof(float), cudaMemcpyDeviceToHost));
    printf("child read %.6e %.6e\n", sum_of(host, N), (double)host[N - 1]);
    CK(cudaIpcCloseMemHandle(x));
    free(host);
    return 0;
}

// Runs this program again as a child with `args`; returns what it read (sum, last element).
static void run_child(const char *self, const std::string &args, double *sum, double *last) {
    std::string cmd = std::string(self) + " " + args;
    fflush(stdout);
    FILE *out = popen(cmd.c_str(), "r");
    EXPECT(out != nullptr, "cannot start the child");
    char line[256];
    *sum = *last = -1;
    while (fgets(line, sizeof line, out)) {
        if (sscanf(line, "child read %lf %lf", sum, last) != 2) printf("child: %s", line);
    }
    int status = pclose(out);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
}

// The child: opens the parent's allocation and event, reads after the event, adds one to
// every element in place, closes. Prints what it read for the parent's CHECK lines.
static int child(const char *mem_hex, const char *event_hex) {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t ev;
    from_hex(mem_hex, &mem, sizeof mem);
    from_hex(event_hex, &ev, sizeof ev);
    float *x = nullptr;
    CK(cudaIpcOpenMemHandle((void **)&x, mem, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t ready;
    CK(cudaIpcOpenEventHandle(&ready, ev));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamWaitEvent(s, ready, 0));
    float *host = (float *)malloc(N * sizeof(float));
    CK(cudaMemcpyAsync(host, x, N * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    printf("child read %.6e %.6e\n", sum_of(host, N), (double)host[N - 1]);
    add_one<<<(N + 255) / 256, 256, 0, s>>>(x, N);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    CK(cudaEventDestroy(ready));
    CK(cudaIpcCloseMemHandle(x));
    // Closed: no longer a mapping.
    EXPECT(cudaIpcCloseMemHandle(x) != cudaSuccess, "closing a mapping twice succeeded");
    cudaGetLastError();
    free(host);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "child") == 0) return child(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "zeros") == 0) return zeros_child(argv[2]);

    float *x = nullptr;
    CK(cudaMalloc(&x, N * sizeof(float)));
    cudaIpcMemHandle_t mem, again;
    CK(cudaIpcGetMemHandle(&mem, x));
    CK(cudaIpcGetMemHandle(&again, x));
    EXPECT(memcmp(&mem, &again, sizeof mem) == 0, "one allocation gave two different handles");
    cudaEvent_t ready;
    CK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t ev;
    CK(cudaIpcGetEventHandle(&ev, ready));
    // Errors: an event without the interprocess flag; host memory.
    cudaEvent_t plain;
    CK(cudaEventCreate(&plain));
    cudaIpcEventHandle_t none;
    EXPECT(cudaIpcGetEventHandle(&none, plain) != cudaSuccess,
           "an IPC handle of an event made without cudaEventInterprocess");
    cudaGetLastError();
    int on_host = 0;
    EXPECT(cudaIpcGetMemHandle(&again, &on_host) != cudaSuccess, "an IPC handle of host memory");
    cudaGetLastError();

    // The parent's writes, ordered before the child's reads by the event only.
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fill<<<(N + 255) / 256, 256, 0, s>>>(x, N, 0.5f);
    CK(cudaGetLastError());
    CK(cudaEventRecord(ready, s));

    double read_sum, read_last;
    run_child(argv[0], "child " + to_hex(&mem, sizeof mem) + " " + to_hex(&ev, sizeof ev),
              &read_sum, &read_last);
    printf("CHECK child_read %.6e %.6e\n", read_sum, read_last);

    float *host = (float *)malloc(N * sizeof(float));
    CK(cudaMemcpy(host, x, N * sizeof(float), cudaMemcpyDeviceToHost));
    printf("CHECK parent_after %.6e %.6e\n", sum_of(host, N), (double)host[N - 1]);
    for (int i = 0; i < N; ++i) {
        float want = 0.5f * (float)(i % 1000) + 1.0f;
        EXPECT(host[i] == want, "element %d is %f, not %f", i, host[i], want);
    }

    // SYNC_MEMOPS: off by default, set, read back; only that attribute can be set.
    CUdeviceptr dx = (CUdeviceptr)x;
    unsigned int sync_before = 7, sync_after = 7, on = 1;
    EXPECT(cuPointerGetAttribute(&sync_before, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dx) ==
               CUDA_SUCCESS, "reading SYNC_MEMOPS");
    EXPECT(cuPointerSetAttribute(&on, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dx) == CUDA_SUCCESS,
           "setting SYNC_MEMOPS");
    EXPECT(cuPointerGetAttribute(&sync_after, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dx + 64) ==
               CUDA_SUCCESS, "reading SYNC_MEMOPS inside the allocation");
    int other_attribute = cuPointerSetAttribute(&on, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dx) != 0;
    int on_host_memory = cuPointerSetAttribute(&on, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                               (CUdeviceptr)&on_host) != 0;
    printf("CHECK sync_memops %u %u refused %d %d\n", sync_before, sync_after, other_attribute,
           on_host_memory);
    CK(cudaMemset(x, 0, N * sizeof(float)));
    run_child(argv[0], "zeros " + to_hex(&mem, sizeof mem), &read_sum, &read_last);
    printf("CHECK zeros_child_read %.6e %.6e\n", read_sum, read_last);
    EXPECT(read_sum == 0 && read_last == 0, "after a synchronous memset, the child read %f",
           read_sum);

    CK(cudaEventDestroy(ready));
    CK(cudaEventDestroy(plain));
    CK(cudaFree(x));
    free(host);
    printf("PASS ipc\n");
    return 0;
}
