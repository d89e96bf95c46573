// graph_queries: the graph API's queries and edits beyond building and launching. A graph
// captured from two streams (a fork and a join through events) is asked for its edges
// (cuGraphGetEdges, both entry points), cloned (cuGraphClone, cuGraphNodeFindInClone), the
// clone instantiated through the CUDA 11 entry point (cuGraphInstantiate_v2, found by
// cuGetProcAddress) and launched; a node is disabled and asked back (cuGraphNodeGetEnabled);
// a node of a built graph is destroyed (cuGraphDestroyNode). Also cuStreamGetDevice and
// cuDeviceGetByPCIBusId; and the entry points of CUDA 10 to 12.1 that programs built with
// those toolkits ask cuGetProcAddress for. Also event wait nodes given another event, copies
// with 1D arrays (cuMemcpyDtoA, AtoA, AtoD), an executable graph's flags (cuGraphExecGetFlags)
// and context-wide events (cuCtxRecordEvent, cuCtxWaitEvent). Last, copy nodes' parameters
// read back (cuGraphMemcpyNodeGetParams): a 2D device copy the program described with offsets,
// one with a host side, one after cuGraphMemcpyNodeSetParams, and a captured device copy.
//
//   nvcc -O2 -o graph_queries graph_queries.cu -lcuda && ./graph_queries
//
// Prints `CHECK <name> <values>` lines, then `PASS graph_queries`, or `FAIL graph_queries: why`.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>
#include <vector>

#define PROG "graph_queries"
#include "check.h"

#define N 4096

__global__ void scale(float *x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= by;
}

__global__ void add(float *x, const float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// The types of a node list, as one number per node.
static void print_types(const char *name, CUgraphNode *nodes, size_t n) {
    printf("CHECK %s", name);
    for (size_t i = 0; i < n; ++i) {
        CUgraphNodeType t;
        CU(cuGraphNodeGetType(nodes[i], &t));
        printf(" %d", (int)t);
    }
    printf("\n");
}

static double run_and_sum(cudaGraphExec_t exec, cudaStream_t s, float *x, float *y) {
    std::vector<float> ones(N, 1.0f), twos(N, 2.0f), host(N);
    CK(cudaMemcpy(x, ones.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(y, twos.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(host.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (float v : host) sum += v;
    return sum;
}

int main() {
    CK(cudaFree(0));
    float *x, *y;
    CK(cudaMalloc(&x, N * sizeof(float)));
    CK(cudaMalloc(&y, N * sizeof(float)));
    cudaStream_t s, side;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    CUdevice dev;
    CU(cuStreamGetDevice((CUstream)s, &dev));
    int current = -1;
    CK(cudaGetDevice(&current));
    EXPECT(dev == current, "cuStreamGetDevice says %d, the current device is %d", dev, current);
    char bus[32];
    CU(cuDeviceGetPCIBusId(bus, sizeof bus, dev));
    CUdevice by_bus = -1;
    CU(cuDeviceGetByPCIBusId(&by_bus, bus));
    EXPECT(by_bus == dev, "cuDeviceGetByPCIBusId(%s) is device %d, not %d", bus, by_bus, dev);
    EXPECT(cuDeviceGetByPCIBusId(&by_bus, "not a bus id") != CUDA_SUCCESS,
           "a bad PCI bus id was found");

    // x = (x * 3) + (y * 0.5), y scaled on a side stream.
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(side, fork, 0));
    scale<<<N / 256, 256, 0, s>>>(x, 3.0f, N);
    scale<<<N / 256, 256, 0, side>>>(y, 0.5f, N);
    CK(cudaEventRecord(join, side));
    CK(cudaStreamWaitEvent(s, join, 0));
    add<<<N / 256, 256, 0, s>>>(x, y, N);
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(s, &graph));

    size_t edges = 0;
    CU(cuGraphGetEdges((CUgraph)graph, nullptr, nullptr, nullptr, &edges));
    std::vector<CUgraphNode> from(edges + 1), to(edges + 1);
    std::vector<CUgraphEdgeData> data(edges + 1);
    size_t room = edges + 1;
    CU(cuGraphGetEdges((CUgraph)graph, from.data(), to.data(), data.data(), &room));
    EXPECT(room == edges, "%zu edges listed of %zu", room, edges);
    printf("CHECK edges %zu\n", edges);
    print_types("edge_from_types", from.data(), edges);
    print_types("edge_to_types", to.data(), edges);
    // The CUDA 10 entry point (no edge data), by its versioned name.
    CUresult (*get_edges_v1)(CUgraph, CUgraphNode *, CUgraphNode *, size_t *) = nullptr;
    CUdriverProcAddressQueryResult found;
    CU(cuGetProcAddress("cuGraphGetEdges", (void **)&get_edges_v1, 10000, 0, &found));
    EXPECT(get_edges_v1 != nullptr, "no cuGraphGetEdges for CUDA 10");
    room = edges;
    CU(get_edges_v1((CUgraph)graph, from.data(), to.data(), &room));
    EXPECT(room == edges, "the CUDA 10 entry point listed %zu edges", room);

    size_t count = 0;
    CU(cuGraphGetNodes((CUgraph)graph, nullptr, &count));
    std::vector<CUgraphNode> nodes(count), in_clone(count);
    CU(cuGraphGetNodes((CUgraph)graph, nodes.data(), &count));
    print_types("nodes", nodes.data(), count);

    CUgraph clone;
    CU(cuGraphClone(&clone, (CUgraph)graph));
    for (size_t i = 0; i < count; ++i) CU(cuGraphNodeFindInClone(&in_clone[i], nodes[i], clone));
    print_types("clone_nodes", in_clone.data(), count);
    size_t clone_count = 0;
    CU(cuGraphGetNodes(clone, nullptr, &clone_count));
    EXPECT(clone_count == count, "the clone has %zu nodes of %zu", clone_count, count);
    // A node is not found in a graph that is not its clone.
    CUgraphNode none;
    EXPECT(cuGraphNodeFindInClone(&none, in_clone[0], (CUgraph)graph) != CUDA_SUCCESS,
           "a node found in a graph that is not its graph's clone");

    // The clone through the CUDA 11 entry point.
    CUresult (*instantiate_v2)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t) = nullptr;
    CU(cuGetProcAddress("cuGraphInstantiate", (void **)&instantiate_v2, 11000, 0, &found));
    EXPECT(instantiate_v2 != nullptr, "no cuGraphInstantiate for CUDA 11");
    CUgraphExec clone_exec;
    CUgraphNode error_node = (CUgraphNode)1;
    char log[64] = "unwritten";
    CU(instantiate_v2(&clone_exec, clone, &error_node, log, sizeof log));
    printf("CHECK clone_result %.6e\n", run_and_sum((cudaGraphExec_t)clone_exec, s, x, y));

    // Disabling the side stream's kernel node in the original's executable graph.
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    printf("CHECK original_result %.6e\n", run_and_sum(exec, s, x, y));
    CUgraphNode kernel = nullptr;
    for (size_t i = 0; i < count; ++i) {
        CUgraphNodeType t;
        CU(cuGraphNodeGetType(nodes[i], &t));
        if (t == CU_GRAPH_NODE_TYPE_KERNEL) {
            kernel = nodes[i];
            break;
        }
    }
    EXPECT(kernel != nullptr, "no kernel node");
    unsigned enabled = 7;
    CU(cuGraphNodeGetEnabled((CUgraphExec)exec, kernel, &enabled));
    printf("CHECK enabled_before %u\n", enabled);
    CU(cuGraphNodeSetEnabled((CUgraphExec)exec, kernel, 0));
    CU(cuGraphNodeGetEnabled((CUgraphExec)exec, kernel, &enabled));
    printf("CHECK enabled_after %u\n", enabled);
    printf("CHECK disabled_result %.6e\n", run_and_sum(exec, s, x, y));

    // A built graph: an empty node before a kernel node; the empty node destroyed.
    CUgraph built;
    CU(cuGraphCreate(&built, 0));
    CUgraphNode empty, work;
    CU(cuGraphAddEmptyNode(&empty, built, nullptr, 0));
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    CUfunction fn;
    CK(cudaGetFuncBySymbol((cudaFunction_t *)&fn, (const void *)scale));
    float by = 4.0f;
    int n = N;
    void *args[] = {&x, &by, &n};
    kp.func = fn;
    kp.gridDimX = N / 256;
    kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = 256;
    kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = args;
    CU(cuGraphAddKernelNode(&work, built, &empty, 1, &kp));
    size_t built_edges = 0;
    CU(cuGraphGetEdges(built, nullptr, nullptr, nullptr, &built_edges));
    CU(cuGraphDestroyNode(empty));
    size_t left = 0, left_edges = 0;
    CU(cuGraphGetNodes(built, nullptr, &left));
    CU(cuGraphGetEdges(built, nullptr, nullptr, nullptr, &left_edges));
    printf("CHECK destroyed %zu %zu %zu\n", built_edges, left, left_edges);
    cudaGraphExec_t built_exec;
    CK(cudaGraphInstantiate(&built_exec, (cudaGraph_t)built, 0));
    printf("CHECK built_result %.6e\n", run_and_sum(built_exec, s, x, y));

    // The entry points of older toolkits, by their versions: a CUDA 11 kernel node (the
    // shorter parameter struct), CUDA 12.1's plain dependencies, CUDA 11's update and CUDA 10's
    // capture query (10.1).
    struct KernelParamsV1 {
        CUfunction func;
        unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
        void **kernelParams, **extra;
    } v1 = {fn, N / 256, 1, 1, 256, 1, 1, 0, args, nullptr};
    CUresult (*add_kernel_v1)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const KernelParamsV1 *) = nullptr;
    CUresult (*add_deps_v1)(CUgraph, const CUgraphNode *, const CUgraphNode *, size_t) = nullptr;
    CUresult (*get_deps_v1)(CUgraphNode, CUgraphNode *, size_t *) = nullptr;
    CUresult (*update_v1)(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *) = nullptr;
    CUresult (*capture_info_v1)(CUstream, CUstreamCaptureStatus *, cuuint64_t *) = nullptr;
    CU(cuGetProcAddress("cuGraphAddKernelNode", (void **)&add_kernel_v1, 11000, 0, &found));
    CU(cuGetProcAddress("cuGraphAddDependencies", (void **)&add_deps_v1, 12010, 0, &found));
    CU(cuGetProcAddress("cuGraphNodeGetDependencies", (void **)&get_deps_v1, 12010, 0, &found));
    CU(cuGetProcAddress("cuGraphExecUpdate", (void **)&update_v1, 11000, 0, &found));
    CU(cuGetProcAddress("cuStreamGetCaptureInfo", (void **)&capture_info_v1, 10010, 0, &found));
    EXPECT(add_kernel_v1 && add_deps_v1 && get_deps_v1 && update_v1 && capture_info_v1,
           "an older entry point was not found");
    CUgraph old;
    CU(cuGraphCreate(&old, 0));
    CUgraphNode first, second;
    CU(cuGraphAddEmptyNode(&first, old, nullptr, 0));
    CU(add_kernel_v1(&second, old, nullptr, 0, &v1));
    CU(add_deps_v1(old, &first, &second, 1));
    size_t deps = 0;
    CU(get_deps_v1(second, nullptr, &deps));
    CUgraphExec old_exec;
    CU(cuGraphInstantiateWithFlags(&old_exec, old, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    cuuint64_t exec_flags = 0;
    CU(cuGraphExecGetFlags(old_exec, &exec_flags));
    printf("CHECK exec_flags %llu\n", (unsigned long long)exec_flags);
    printf("CHECK old_entry_points %zu %.6e\n", deps,
           run_and_sum((cudaGraphExec_t)old_exec, s, x, y));
    CUgraphNode error_at = (CUgraphNode)1;
    CUgraphExecUpdateResult verdict = CU_GRAPH_EXEC_UPDATE_ERROR;
    CU(update_v1(old_exec, old, &error_at, &verdict));
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    cuuint64_t capture_id = 0;
    CU(capture_info_v1((CUstream)s, &capturing, &capture_id));
    printf("CHECK old_update %d %d %d\n", (int)verdict, error_at == nullptr, (int)capturing);
    CU(cuGraphExecDestroy(old_exec));
    CU(cuGraphDestroy(old));

    // An event wait node given another event, in the graph and in its executable graph.
    CUgraph waits;
    CU(cuGraphCreate(&waits, 0));
    CUgraphNode wait_node;
    CU(cuGraphAddEventWaitNode(&wait_node, waits, nullptr, 0, (CUevent)fork));
    CU(cuGraphEventWaitNodeSetEvent(wait_node, (CUevent)join));
    CUevent waited = nullptr;
    CU(cuGraphEventWaitNodeGetEvent(wait_node, &waited));
    CUgraphNode record_node;
    CU(cuGraphAddEventRecordNode(&record_node, waits, &wait_node, 1, (CUevent)fork));
    CUevent recorded = nullptr;
    CU(cuGraphEventRecordNodeGetEvent(record_node, &recorded));
    printf("CHECK event_nodes_get %d %d\n", waited == (CUevent)join, recorded == (CUevent)fork);
    CUgraphExec waits_exec;
    CU(cuGraphInstantiateWithFlags(&waits_exec, waits, 0));
    CU(cuGraphExecEventWaitNodeSetEvent(waits_exec, wait_node, (CUevent)fork));
    CU(cuGraphLaunch(waits_exec, (CUstream)s));
    CK(cudaStreamSynchronize(s));
    CU(cuGraphExecDestroy(waits_exec));
    CU(cuGraphDestroy(waits));

    // Copies with 1D arrays: device to array, array to array, array to device.
    CUDA_ARRAY_DESCRIPTOR desc = {};
    desc.Width = N;
    desc.Height = 0;
    desc.Format = CU_AD_FORMAT_FLOAT;
    desc.NumChannels = 1;
    CUarray a1, a2;
    CU(cuArrayCreate(&a1, &desc));
    CU(cuArrayCreate(&a2, &desc));
    std::vector<float> ramp(N), back(N);
    for (int i = 0; i < N; ++i) ramp[i] = (float)i;
    CK(cudaMemcpy(y, ramp.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    CU(cuMemcpyDtoA(a1, 0, (CUdeviceptr)y, N * sizeof(float)));
    CU(cuMemcpyAtoA(a2, 16 * sizeof(float), a1, 0, (N - 16) * sizeof(float)));
    CU(cuMemcpyAtoD((CUdeviceptr)x, a2, 16 * sizeof(float), (N - 16) * sizeof(float)));
    CK(cudaMemcpy(back.data(), x, (N - 16) * sizeof(float), cudaMemcpyDeviceToHost));
    double array_sum = 0;
    for (int i = 0; i < N - 16; ++i) array_sum += back[i];
    printf("CHECK array_copies %.6e %.6e\n", array_sum, (double)back[N - 17]);
    CU(cuArrayDestroy(a1));
    CU(cuArrayDestroy(a2));

    // Context-wide events (CUDA 12.5): one that completes after every stream's earlier work,
    // and every stream's later work waiting for one.
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));
    CUevent all_done, gate;
    CU(cuEventCreate(&all_done, CU_EVENT_DEFAULT));
    CU(cuEventCreate(&gate, CU_EVENT_DEFAULT));
    scale<<<(N + 255) / 256, 256, 0, side>>>(x, 2.0f, N);
    CU(cuCtxRecordEvent(ctx, all_done));
    CU(cuEventSynchronize(all_done));
    CK(cudaMemcpy(back.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
    double recorded_sum = 0;
    for (int i = 0; i < N; ++i) recorded_sum += back[i];
    add<<<(N + 255) / 256, 256, 0, side>>>(x, y, N);
    CU(cuEventRecord(gate, (CUstream)side));
    CU(cuCtxWaitEvent(ctx, gate));
    scale<<<(N + 255) / 256, 256, 0, s>>>(x, 0.5f, N);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(back.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
    double waited_sum = 0;
    for (int i = 0; i < N; ++i) waited_sum += back[i];
    printf("CHECK context_events %.6e %.6e\n", recorded_sum, waited_sum);
    CU(cuEventDestroy(all_done));
    CU(cuEventDestroy(gate));

    // Copy nodes read back: as described (offsets kept), a host side kept, new parameters.
    CUgraph copies;
    CU(cuGraphCreate(&copies, 0));
    CUDA_MEMCPY3D d2d;
    memset(&d2d, 0, sizeof d2d);
    d2d.srcMemoryType = d2d.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    d2d.srcDevice = (CUdeviceptr)y;
    d2d.dstDevice = (CUdeviceptr)x;
    d2d.srcXInBytes = 16;
    d2d.srcY = 1;
    d2d.srcPitch = d2d.dstPitch = 1024;
    d2d.WidthInBytes = 512;
    d2d.Height = 3;
    d2d.Depth = 1;
    CUgraphNode device_copy, host_copy;
    CU(cuGraphAddMemcpyNode(&device_copy, copies, nullptr, 0, &d2d, ctx));
    CUDA_MEMCPY3D h2d;
    memset(&h2d, 0, sizeof h2d);
    h2d.srcMemoryType = CU_MEMORYTYPE_HOST;
    h2d.srcHost = back.data();
    h2d.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    h2d.dstDevice = (CUdeviceptr)y;
    h2d.WidthInBytes = 256;
    h2d.Height = h2d.Depth = 1;
    CU(cuGraphAddMemcpyNode(&host_copy, copies, &device_copy, 1, &h2d, ctx));
    CUDA_MEMCPY3D got;
    CU(cuGraphMemcpyNodeGetParams(device_copy, &got));
    printf("CHECK copy_node_device %d %lld %lld %zu %zu %zu %zu %zu\n", (int)got.srcMemoryType,
           (long long)(got.srcDevice - (CUdeviceptr)y), (long long)(got.dstDevice - (CUdeviceptr)x),
           got.srcXInBytes, got.srcY, got.srcPitch, got.WidthInBytes, got.Height);
    CU(cuGraphMemcpyNodeGetParams(host_copy, &got));
    printf("CHECK copy_node_host %d %d %zu\n", (int)got.srcMemoryType,
           got.srcHost == back.data(), got.WidthInBytes);
    d2d.WidthInBytes = 128;
    d2d.srcY = 2;
    CU(cuGraphMemcpyNodeSetParams(device_copy, &d2d));
    CU(cuGraphMemcpyNodeGetParams(device_copy, &got));
    printf("CHECK copy_node_set %zu %zu\n", got.WidthInBytes, got.srcY);
    EXPECT(cuGraphMemcpyNodeGetParams(device_copy, nullptr) != CUDA_SUCCESS,
           "reading a copy node into null");
    CUgraphNode not_a_copy;
    CU(cuGraphAddEmptyNode(&not_a_copy, copies, nullptr, 0));
    EXPECT(cuGraphMemcpyNodeGetParams(not_a_copy, &got) != CUDA_SUCCESS,
           "an empty node read back as a copy");
    // A captured device copy: the graph's only node.
    cudaGraph_t captured;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(x + 8, y + 4, 1000 * sizeof(float), cudaMemcpyDeviceToDevice, s));
    CK(cudaStreamEndCapture(s, &captured));
    CUgraphNode copy_node;
    size_t one = 1;
    CU(cuGraphGetNodes((CUgraph)captured, &copy_node, &one));
    CU(cuGraphMemcpyNodeGetParams(copy_node, &got));
    unsigned long long src_at = got.srcDevice + got.srcXInBytes - (CUdeviceptr)y;
    unsigned long long dst_at = got.dstDevice + got.dstXInBytes - (CUdeviceptr)x;
    printf("CHECK copy_node_captured %llu %llu %zu %zu %zu\n", src_at, dst_at,
           got.WidthInBytes, got.Height, got.Depth);
    CK(cudaGraphDestroy(captured));
    CU(cuGraphDestroy(copies));

    CK(cudaGraphExecDestroy(built_exec));
    CK(cudaGraphExecDestroy(exec));
    CU(cuGraphExecDestroy(clone_exec));
    CU(cuGraphDestroy(built));
    CU(cuGraphDestroy(clone));
    CK(cudaGraphDestroy(graph));
    CK(cudaFree(x));
    CK(cudaFree(y));
    printf("PASS graph_queries\n");
    return 0;
}
