// vmm: the driver's virtual memory management as caching allocators use it (PyTorch's
// expandable segments): reserve an address range, create physical memory, map it, grant
// access, use it from a kernel and from copies, grow the mapping, read an allocation's
// properties back from its handle, then unmap and release.
//
//   nvcc -O2 -o vmm vmm.cu -lcuda && ./vmm
//
// Prints `CHECK` lines, then `PASS vmm`, or `FAIL vmm: why` and exit status 1.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "vmm"
#include "check.h"

__global__ void fill(unsigned *p, size_t n, unsigned base) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = base + (unsigned)i;
}

int main() {
    CK(cudaFree(0));  // the runtime's primary context, current on this thread
    CUdevice device;
    CU(cuCtxGetDevice(&device));

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t granularity = 0;
    CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT(granularity > 0, "granularity 0");

    // Reserve room for 8 chunks; map 2, then grow to 4.
    const size_t chunk = 4 * granularity, reserved = 8 * chunk;
    CUdeviceptr base = 0;
    CU(cuMemAddressReserve(&base, reserved, 0, 0, 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::vector<CUmemGenericAllocationHandle> handles;
    for (int grow = 0; grow < 2; ++grow) {
        for (int k = 0; k < 2; ++k) {
            CUmemGenericAllocationHandle handle;
            CU(cuMemCreate(&handle, chunk, &prop, 0));
            CU(cuMemMap(base + handles.size() * chunk, chunk, 0, handle, 0));
            handles.push_back(handle);
        }
        CU(cuMemSetAccess(base, handles.size() * chunk, &access, 1));
    }
    const size_t words = handles.size() * chunk / sizeof(unsigned);
    fill<<<264, 256>>>((unsigned *)base, words, 1000u);
    CK(cudaGetLastError());
    CU(cuMemsetD32(base + chunk, 7u, 16));  // inside the second chunk
    std::vector<unsigned> back(words);
    CK(cudaMemcpy(back.data(), (void *)base, words * sizeof(unsigned), cudaMemcpyDeviceToHost));
    const size_t seventh = chunk / sizeof(unsigned);
    for (size_t i = 0; i < words; ++i) {
        unsigned want = (i >= seventh && i < seventh + 16) ? 7u : 1000u + (unsigned)i;
        EXPECT(back[i] == want, "word %zu = %u, want %u", i, back[i], want);
    }
    printf("CHECK vmm_words %.6e %.6e\n", (double)back[1], (double)back[words - 1]);

    // The properties an allocation was made with, read back from its handle.
    CUmemAllocationProp got = {};
    CU(cuMemGetAllocationPropertiesFromHandle(&got, handles[0]));
    EXPECT(got.type == prop.type && got.location.type == prop.location.type &&
               got.location.id == prop.location.id,
           "properties from the handle: type %d location %d/%d", (int)got.type,
           (int)got.location.type, got.location.id);
    printf("CHECK vmm_properties %d %d %d\n", (int)got.type, (int)got.location.type, got.location.id);

    CU(cuMemUnmap(base, handles.size() * chunk));
    for (CUmemGenericAllocationHandle handle : handles) CU(cuMemRelease(handle));
    CU(cuMemAddressFree(base, reserved));
    printf("PASS " PROG "\n");
    return 0;
}
