// managed: managed memory (cudaMallocManaged) as programs written for any GPU use it: the host
// fills it, kernels change it, the host reads it after a synchronization; rounds of
// host-write / kernel / host-read; a linked list built on the host with pointers between
// managed nodes that a kernel walks; cudaMemcpy to and from managed memory; prefetch, advice
// and range attributes; a stream-attached allocation; pointer attributes; a Thrust
// universal_vector sorted on the device and read on the host; 256 MiB filled on the host and
// summed on the device (timed). Every result is checked against the CPU.
//
//   nvcc -O2 -o managed managed.cu && ./managed
//
// Prints `CHECK` lines, then `PASS managed`, or `FAIL managed: why` and exit status 1.
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/sort.h>
#include <thrust/universal_vector.h>
#include <chrono>
#include <cstdio>
#include <cstring>

#define PROG "managed"
#include "check.h"

__global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}

__global__ void add_index(int *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += i;
}

struct Node {
    Node *next;
    int value;
};

__global__ void walk(const Node *head, long long *sum, int *count) {
    long long s = 0;
    int c = 0;
    for (const Node *n = head; n; n = n->next) {
        s += n->value;
        ++c;
    }
    *sum = s;
    *count = c;
}

__global__ void sum_words(const unsigned *x, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += x[i];
    atomicAdd(out, s);
}

static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
    int dev = 0, managed_ok = 0, concurrent = 0;
    CK(cudaDeviceGetAttribute(&managed_ok, cudaDevAttrManagedMemory, dev));
    CK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
    EXPECT(managed_ok == 1, "cudaDevAttrManagedMemory = %d", managed_ok);
    printf("concurrentManagedAccess %d\n", concurrent);

    // Host fills, kernel scales, host reads.
    const int n = 1 << 20;
    float *x;
    CK(cudaMallocManaged(&x, n * sizeof(float)));
    for (int i = 0; i < n; ++i) x[i] = float(i % 1000);
    scale<<<n / 256, 256>>>(x, 2.0f, n);
    CK_LAUNCH();
    for (int i = 0; i < n; ++i) EXPECT(x[i] == float(i % 1000) * 2.0f, "x[%d] = %g", i, x[i]);
    printf("CHECK scaled %.6e %.6e\n", x[1], x[n - 1]);

    // Rounds: the host changes a few elements, a kernel adds the index, the host checks.
    const int m = 300000;
    int *v;
    CK(cudaMallocManaged(&v, m * sizeof(int)));
    memset(v, 0, m * sizeof(int));
    long long expected_first = 0, expected_last = 0;
    for (int round = 0; round < 10; ++round) {
        v[0] += 7;
        v[m - 1] += 3;
        add_index<<<(m + 255) / 256, 256>>>(v, m);
        CK_LAUNCH();
        expected_first += 7;
        expected_last += 3 + (m - 1);
        EXPECT(v[0] == expected_first && v[m - 1] == expected_last && v[m / 2] == (round + 1) * (m / 2),
               "round %d: v[0] %d v[last] %d v[mid] %d", round, v[0], v[m - 1], v[m / 2]);
    }
    printf("CHECK rounds %.6e %.6e\n", double(v[0]), double(v[m - 1]));

    // Pointers inside managed memory: a list built on the host, walked on the device.
    const int nodes = 1000;
    Node *pool;
    long long *sum;
    int *count;
    CK(cudaMallocManaged(&pool, nodes * sizeof(Node)));
    CK(cudaMallocManaged(&sum, sizeof(long long)));
    CK(cudaMallocManaged(&count, sizeof(int)));
    long long expected_sum = 0;
    for (int i = 0; i < nodes; ++i) {
        // Every third node is skipped by the links; values are the index squared.
        int next = i + (i % 3 == 0 ? 2 : 1);
        pool[i].next = next < nodes ? &pool[next] : nullptr;
        pool[i].value = i * i;
    }
    int expected_count = 0;
    for (Node *p = pool; p; p = p->next) {
        expected_sum += p->value;
        ++expected_count;
    }
    walk<<<1, 1>>>(pool, sum, count);
    CK_LAUNCH();
    EXPECT(*sum == expected_sum && *count == expected_count, "list: sum %lld count %d, expected %lld %d",
           *sum, *count, expected_sum, expected_count);
    printf("CHECK list %.6e %.6e\n", double(*sum), double(*count));

    // cudaMemcpy to and from managed memory (the runtime infers directions).
    float host[1000];
    CK(cudaMemcpy(host, x + 5000, sizeof host, cudaMemcpyDefault));
    for (int i = 0; i < 1000; ++i) EXPECT(host[i] == x[5000 + i], "memcpy from managed [%d]", i);
    for (int i = 0; i < 1000; ++i) host[i] = -float(i);
    CK(cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice));
    EXPECT(x[999] == -999.0f && x[1000] == float(1000 % 1000) * 2.0f, "memcpy into managed: %g %g", x[999], x[1000]);
    float *plain;
    CK(cudaMalloc(&plain, 1000 * sizeof(float)));
    CK(cudaMemcpy(plain, x, 1000 * sizeof(float), cudaMemcpyDefault));
    x[0] = 12345.0f;
    CK(cudaMemcpy(x, plain, 1000 * sizeof(float), cudaMemcpyDefault));
    EXPECT(x[0] == 0.0f && x[999] == -999.0f, "device copies with managed memory: %g %g", x[0], x[999]);

    // Prefetch, advice and range attributes.
    cudaMemLocation to_device = {cudaMemLocationTypeDevice, dev};
    cudaMemLocation to_host = {cudaMemLocationTypeHost, 0};
    CK(cudaMemPrefetchAsync(x, n * sizeof(float), to_device, 0, 0));
    scale<<<n / 256, 256>>>(x, 0.5f, n);
    CK(cudaMemPrefetchAsync(x, n * sizeof(float), to_host, 0, 0));
    CK(cudaDeviceSynchronize());
    EXPECT(x[n - 1] == float((n - 1) % 1000), "after prefetches x[last] = %g", x[n - 1]);
    CK(cudaMemAdvise(x, n * sizeof(float), cudaMemAdviseSetReadMostly, to_device));
    int read_mostly = -1;
    CK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, x,
                                n * sizeof(float)));
    EXPECT(read_mostly == 1, "read mostly = %d", read_mostly);
    CK(cudaMemAdvise(x, n * sizeof(float), cudaMemAdviseSetPreferredLocation, to_device));
    int preferred = -9;
    CK(cudaMemRangeGetAttribute(&preferred, sizeof preferred, cudaMemRangeAttributePreferredLocation, x,
                                n * sizeof(float)));
    EXPECT(preferred == dev, "preferred location = %d", preferred);
    printf("CHECK advice %.6e %.6e\n", double(read_mostly), double(preferred));

    // An allocation attached to one stream: the host may use it once that stream is idle.
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    int *attached;
    CK(cudaMallocManaged(&attached, 4096 * sizeof(int), cudaMemAttachHost));
    for (int i = 0; i < 4096; ++i) attached[i] = 1;
    CK(cudaStreamAttachMemAsync(stream, attached, 0, cudaMemAttachSingle));
    add_index<<<16, 256, 0, stream>>>(attached, 4096);
    CK(cudaStreamSynchronize(stream));
    EXPECT(attached[4095] == 4096 && attached[0] == 1, "attached: %d %d", attached[0], attached[4095]);

    // Pointer attributes.
    cudaPointerAttributes attrs;
    CK(cudaPointerGetAttributes(&attrs, x + 10));
    EXPECT(attrs.type == cudaMemoryTypeManaged && attrs.devicePointer == x + 10 && attrs.hostPointer == x + 10,
           "attributes: type %d", int(attrs.type));

    // Thrust: a universal_vector sorted on the device, read on the host.
    thrust::universal_vector<int> keys(100000);
    for (int i = 0; i < 100000; ++i) keys[i] = (i * 7919) % 100003;
    thrust::sort(thrust::device, keys.begin(), keys.end());
    CK(cudaDeviceSynchronize());
    for (int i = 1; i < 100000; ++i) EXPECT(keys[i - 1] <= keys[i], "thrust sort at %d", i);
    printf("CHECK thrust %.6e %.6e\n", double(keys[0]), double(keys[99999]));

    // 256 MiB: filled on the host, summed on the device, read back on the host.
    const size_t words = (256u << 20) / sizeof(unsigned);
    unsigned *big;
    unsigned long long *total;
    CK(cudaMallocManaged(&big, words * sizeof(unsigned)));
    CK(cudaMallocManaged(&total, sizeof *total));
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < words; ++i) big[i] = unsigned(i & 0xff);
    *total = 0;
    double fill = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    sum_words<<<1024, 256>>>(big, words, total);
    CK_LAUNCH();
    double kernel = seconds_since(t0);
    unsigned long long expect_total = (words / 256) * (255ull * 256 / 2);
    EXPECT(*total == expect_total, "sum %llu, expected %llu", *total, expect_total);
    t0 = std::chrono::steady_clock::now();
    unsigned long long host_sum = 0;
    for (size_t i = 0; i < words; ++i) host_sum += big[i];
    double read = seconds_since(t0);
    EXPECT(host_sum == expect_total, "host sum %llu", host_sum);
    printf("CHECK big %.6e\n", double(*total));
    printf("TIME managed_256MiB host_fill %.3f s, launch+sync %.3f s, host_read %.3f s\n", fill, kernel, read);

    CK(cudaFree(big));
    CK(cudaFree(total));
    CK(cudaFree(attached));
    CK(cudaFree(pool));
    CK(cudaFree(sum));
    CK(cudaFree(count));
    CK(cudaFree(plain));
    CK(cudaFree(v));
    CK(cudaFree(x));
    CK(cudaStreamDestroy(stream));
    printf("PASS managed\n");
    return 0;
}
