// pools_attrs: memory pools (the device's default pool and a created one: stream-ordered
// allocations from them, attributes, trim, access, the device's current pool), stream
// attributes, the persisting L2 cache reset, profiler start/stop, and tensor maps (TMA
// descriptors: encoded, encoded again, their address replaced and restored). Results checked
// against the CPU.
//
//   nvcc -O2 -o pools_attrs pools_attrs.cu -lcuda && ./pools_attrs
//
// Prints `CHECK` lines, then `PASS pools_attrs`, or `FAIL pools_attrs: why` and exit status 1.
#include <cuda.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>
#include <vector>

#define PROG "pools_attrs"
#include "check.h"


__global__ void fill(int *x, int value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value + i;
}

int main() {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(int);
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<int> back(n);

    // The default pool: keep freed memory (release threshold), allocate, use, free.
    cudaMemPool_t def;
    CK(cudaDeviceGetDefaultMemPool(&def, 0));
    uint64_t threshold = 64ull << 20, read_back = 0;
    CK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
    CK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &read_back));
    EXPECT(read_back == threshold, "release threshold %llu", (unsigned long long)read_back);
    int *a;
    CK(cudaMallocFromPoolAsync((void **)&a, bytes, def, stream));
    fill<<<n / 256, 256, 0, stream>>>(a, 7, n);
    CK(cudaMemcpyAsync(back.data(), a, bytes, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    EXPECT(back[n - 1] == 7 + n - 1, "default pool: %d", back[n - 1]);
    uint64_t used = 0;
    CK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &used));
    EXPECT(used >= bytes, "used memory %llu < %zu", (unsigned long long)used, bytes);
    CK(cudaFreeAsync(a, stream));
    CK(cudaStreamSynchronize(stream));
    printf("CHECK default_pool %d %d\n", back[0], back[n - 1]);

    // A created pool, made the device's current pool: cudaMallocAsync takes from it.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    CK(cudaMemPoolCreate(&pool, &props));
    int reuse = 0;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &reuse));
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &reuse));
    EXPECT(reuse == 0, "reuse attribute %d", reuse);
    cudaMemAccessDesc access = {};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = 0;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    CK(cudaMemPoolSetAccess(pool, &access, 1));
    cudaMemAccessFlags flags;
    cudaMemLocation where = access.location;
    CK(cudaMemPoolGetAccess(&flags, pool, &where));
    EXPECT(flags == cudaMemAccessFlagsProtReadWrite, "access flags %d", (int)flags);
    CK(cudaDeviceSetMemPool(0, pool));
    cudaMemPool_t current;
    CK(cudaDeviceGetMemPool(&current, 0));
    EXPECT(current == pool, "current pool is not the created one");
    int *b;
    CK(cudaMallocAsync((void **)&b, bytes, stream));
    fill<<<n / 256, 256, 0, stream>>>(b, -3, n);
    CK(cudaMemcpyAsync(back.data(), b, bytes, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    EXPECT(back[5] == 2, "created pool: %d", back[5]);
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &used));
    EXPECT(used >= bytes, "reserved memory %llu", (unsigned long long)used);
    CK(cudaFreeAsync(b, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemPoolTrimTo(pool, 0));
    CK(cudaDeviceSetMemPool(0, def));
#if CUDA_VERSION >= 13000
    // CUDA 13's pool calls by location: the device's pools of pinned memory.
    CUmemLocation device0 = {};
    device0.type = CU_MEM_LOCATION_TYPE_DEVICE;
    device0.id = 0;
    CUmemoryPool by_location = nullptr, default_by_location = nullptr;
    CU(cuMemSetMemPool(&device0, CU_MEM_ALLOCATION_TYPE_PINNED, (CUmemoryPool)pool));
    CU(cuMemGetMemPool(&by_location, &device0, CU_MEM_ALLOCATION_TYPE_PINNED));
    CU(cuMemGetDefaultMemPool(&default_by_location, &device0, CU_MEM_ALLOCATION_TYPE_PINNED));
    printf("CHECK pools_by_location %d %d\n", by_location == (CUmemoryPool)pool,
           default_by_location == (CUmemoryPool)def);
    CU(cuMemSetMemPool(&device0, CU_MEM_ALLOCATION_TYPE_PINNED, (CUmemoryPool)def));
#endif
    CK(cudaMemPoolDestroy(pool));
    printf("CHECK created_pool %d\n", back[5]);

    // Stream attributes: the synchronization policy, set and read back.
    cudaStreamAttrValue value = {};
    value.syncPolicy = cudaSyncPolicyYield;
    CK(cudaStreamSetAttribute(stream, cudaStreamAttributeSynchronizationPolicy, &value));
    cudaStreamAttrValue out = {};
    CK(cudaStreamGetAttribute(stream, cudaStreamAttributeSynchronizationPolicy, &out));
    EXPECT(out.syncPolicy == cudaSyncPolicyYield, "sync policy %d", (int)out.syncPolicy);
    printf("CHECK stream_attribute %d\n", (int)out.syncPolicy);

    // Persisting L2 lines, reset (no effect on results).
    CK(cudaCtxResetPersistingL2Cache());

    // Profiler markers (forwarded; with no profiler attached they do nothing).
    CK(cudaProfilerStart());
    CK(cudaProfilerStop());

    // A tensor map over a 256x512 float matrix, 32x32 boxes.
    float *m;
    CK(cudaMalloc(&m, 256 * 512 * sizeof(float)));
    CUtensorMap map1, map2, map3;
    cuuint64_t dims[2] = {512, 256}, strides[1] = {512 * sizeof(float)};
    cuuint32_t box[2] = {32, 32}, estrides[2] = {1, 1};  // 128-byte rows, as 128B swizzle needs
    CU(cuTensorMapEncodeTiled(&map1, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, m, dims, strides, box,
                              estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    CU(cuTensorMapEncodeTiled(&map2, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, m, dims, strides, box,
                              estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    EXPECT(memcmp(&map1, &map2, sizeof(map1)) == 0, "the same map encoded twice differs");
    map3 = map1;
    CU(cuTensorMapReplaceAddress(&map3, m + 256 * 256));
    int changed = memcmp(&map1, &map3, sizeof(map1)) != 0;
    CU(cuTensorMapReplaceAddress(&map3, m));
    int restored = memcmp(&map1, &map3, sizeof(map1)) == 0;
    EXPECT(changed && restored, "replace address: changed %d restored %d", changed, restored);
    CUresult bad = cuTensorMapEncodeTiled(&map2, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, m + 1, dims,
                                          strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    EXPECT(bad == CUDA_ERROR_INVALID_VALUE, "a misaligned address gave %d", (int)bad);
    printf("CHECK tensor_map %d %d %d\n", changed, restored, (int)bad);
    CK(cudaFree(m));
    printf("PASS pools_attrs\n");
    return 0;
}
