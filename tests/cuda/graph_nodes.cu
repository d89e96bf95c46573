// graph_nodes: CUDA graphs built node by node, as XLA's command buffers build them: memset,
// kernel, device-to-device copy, empty (barrier) and child-graph nodes; kernel parameters
// updated in the executable graph; an executable graph updated from a new graph; a WHILE
// conditional node whose body kernel decrements a counter on the device and sets the
// condition; stream capture into an existing graph; graph memory (allocation and free nodes,
// the device's graph memory attributes and trim);
// copy nodes with a host side and a host node; kernel-node attributes (set, read, copied);
// the nodes' parameters read back (kernel with its arguments, memset, child graph, graph
// allocation and free, host).
// Checks every result against the CPU.
//
//   nvcc -O2 -o graph_nodes graph_nodes.cu && ./graph_nodes
//
// Prints `CHECK` lines, then `PASS graph_nodes`, or `FAIL graph_nodes: why` and exit status 1.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

#define PROG "graph_nodes"
#include "check.h"

__global__ void scale_add(float *x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + b;
}

// One iteration of a WHILE loop: x += 1 and count down; the loop goes on while *left > 0.
__global__ void loop_body(float *x, int n, int *left, cudaGraphConditionalHandle handle) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
    __syncthreads();
    if (i == 0) {
        int remaining = --*left;
        cudaGraphSetConditional(handle, remaining > 0 ? 1 : 0);
    }
}

// What a host node saw: the last element of the host output, and how often it ran.
struct HostSeen {
    const float *watched;
    int calls;
    float value;
};

static void CUDART_CB on_host(void *data) {
    HostSeen *seen = static_cast<HostSeen *>(data);
    seen->calls++;
    seen->value = *seen->watched;
}

int main() {
    const int n = 4096, threads = 256, blocks = n / threads;
    const size_t bytes = n * sizeof(float);
    float *x, *y;
    int *left;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    CK(cudaMalloc(&left, sizeof(int)));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<float> back(n);

    // memset(x, 2.0f) -> x = 3x + 1 -> barrier -> copy x to y -> child graph: y = 0.5y + 0.
    cudaGraph_t graph, child;
    CK(cudaGraphCreate(&graph, 0));
    CK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t memset_node, kernel_node, barrier, copy_node, child_node, child_kernel;
    cudaMemsetParams ms = {};
    ms.dst = x;
    ms.value = 0x40000000;  // 2.0f
    ms.elementSize = 4;
    ms.width = n;
    ms.height = 1;
    CK(cudaGraphAddMemsetNode(&memset_node, graph, nullptr, 0, &ms));
    float a = 3.0f, b = 1.0f;
    int count = n;
    void *args[] = {&x, &a, &b, &count};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)scale_add;
    kp.gridDim = dim3(blocks);
    kp.blockDim = dim3(threads);
    kp.kernelParams = args;
    CK(cudaGraphAddKernelNode(&kernel_node, graph, &memset_node, 1, &kp));
    CK(cudaGraphAddEmptyNode(&barrier, graph, &kernel_node, 1));
    CK(cudaGraphAddMemcpyNode1D(&copy_node, graph, &barrier, 1, y, x, bytes,
                                cudaMemcpyDeviceToDevice));
    float half = 0.5f, zero = 0.0f;
    void *child_args[] = {&y, &half, &zero, &count};
    cudaKernelNodeParams ckp = kp;
    ckp.kernelParams = child_args;
    CK(cudaGraphAddKernelNode(&child_kernel, child, nullptr, 0, &ckp));
    CK(cudaGraphAddChildGraphNode(&child_node, graph, &copy_node, 1, child));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    EXPECT(nodes == 5, "graph has %zu nodes, expected 5", nodes);
    cudaGraphNodeType type;
    CK(cudaGraphNodeGetType(copy_node, &type));
    EXPECT(type == cudaGraphNodeTypeMemcpy, "copy node has type %d", (int)type);

    // Kernel-node attributes: set, read back, copied to another kernel node.
    cudaLaunchAttributeValue priority = {};
    priority.priority = -1;
    CK(cudaGraphKernelNodeSetAttribute(kernel_node, cudaLaunchAttributePriority, &priority));
    cudaLaunchAttributeValue priority_back = {}, copied = {};
    CK(cudaGraphKernelNodeGetAttribute(kernel_node, cudaLaunchAttributePriority, &priority_back));
    CK(cudaGraphKernelNodeCopyAttributes(child_kernel, kernel_node));
    CK(cudaGraphKernelNodeGetAttribute(child_kernel, cudaLaunchAttributePriority, &copied));
    printf("CHECK kernel_node_attributes %d %d\n", priority_back.priority, copied.priority);

    // The nodes' parameters read back.
    cudaMemsetParams ms_back = {};
    CK(cudaGraphMemsetNodeGetParams(memset_node, &ms_back));
    cudaKernelNodeParams kp_back = {};
    CK(cudaGraphKernelNodeGetParams(kernel_node, &kp_back));
    float a_back = *(float *)kp_back.kernelParams[1];
    int count_back = *(int *)kp_back.kernelParams[3];
    cudaGraph_t embedded;
    CK(cudaGraphChildGraphNodeGetGraph(child_node, &embedded));
    size_t embedded_nodes = 0;
    CK(cudaGraphGetNodes(embedded, nullptr, &embedded_nodes));
    printf("CHECK node_params %d %u %u %zu %d %d %g %d %d %zu\n", ms_back.dst == x, ms_back.value,
           ms_back.elementSize, ms_back.width, kp_back.func == kp.func, kp_back.gridDim.x, a_back,
           count_back, *(float **)kp_back.kernelParams[0] == x, embedded_nodes);

    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back.data(), y, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(back[i] == 3.5f, "y[%d] = %g, expected 3.5", i, back[i]);
    printf("CHECK built %.6e %.6e\n", back[0], back[n - 1]);

    // New kernel parameters in the executable graph: x = 5x - 2 -> y = 0.5 * 8 = 4.
    a = 5.0f;
    b = -2.0f;
    CK(cudaGraphExecKernelNodeSetParams(exec, kernel_node, &kp));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back.data(), y, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(back[i] == 4.0f, "y[%d] = %g after set-params", i, back[i]);
    printf("CHECK set_params %.6e\n", back[7]);

    // The same topology with another memset value, applied by cudaGraphExecUpdate.
    ms.value = 0x3f800000;  // 1.0f: y = 0.5 * (5 - 2) = 1.5
    CK(cudaGraphMemsetNodeSetParams(memset_node, &ms));
    CK(cudaGraphKernelNodeSetParams(kernel_node, &kp));
    cudaGraphExecUpdateResultInfo info;
    CK(cudaGraphExecUpdate(exec, graph, &info));
    EXPECT(info.result == cudaGraphExecUpdateSuccess, "update result %d", (int)info.result);
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back.data(), y, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(back[i] == 1.5f, "y[%d] = %g after update", i, back[i]);
    printf("CHECK exec_update %.6e\n", back[n / 2]);

    // A WHILE loop on the device: 10 iterations of x += 1, starting from 0.
    cudaGraph_t loop;
    CK(cudaGraphCreate(&loop, 0));
    cudaGraphConditionalHandle handle;
    CK(cudaGraphConditionalHandleCreate(&handle, loop, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = handle;
    cp.conditional.type = cudaGraphCondTypeWhile;
    cp.conditional.size = 1;
    cudaGraphNode_t cond_node, body_node;
    CK(cudaGraphAddNode(&cond_node, loop, nullptr, nullptr, 0, &cp));
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    EXPECT(body != nullptr, "no body graph");
    void *body_args[] = {&x, &count, &left, &handle};
    cudaKernelNodeParams bp = {};
    bp.func = (void *)loop_body;
    bp.gridDim = dim3(1);
    bp.blockDim = dim3(threads);
    bp.kernelParams = body_args;
    int small = threads;  // the body touches the first 256 elements
    body_args[1] = &small;
    CK(cudaGraphAddKernelNode(&body_node, body, nullptr, 0, &bp));
    int ten = 10;
    CK(cudaMemset(x, 0, bytes));
    CK(cudaMemcpy(left, &ten, sizeof(int), cudaMemcpyHostToDevice));
    cudaGraphExec_t loop_exec;
    CK(cudaGraphInstantiate(&loop_exec, loop, 0));
    CK(cudaGraphLaunch(loop_exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back.data(), x, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < threads; ++i) EXPECT(back[i] == 10.0f, "loop x[%d] = %g", i, back[i]);
    printf("CHECK while_loop %.6e %.6e\n", back[0], back[threads]);

    // Stream capture into an existing graph, after its node: x = 2x + 3 twice -> 2(2*10+3)+3.
    cudaGraph_t more;
    CK(cudaGraphCreate(&more, 0));
    cudaGraphNode_t first;
    CK(cudaGraphAddEmptyNode(&first, more, nullptr, 0));
    CK(cudaStreamBeginCaptureToGraph(stream, more, &first, nullptr, 1,
                                     cudaStreamCaptureModeThreadLocal));
    scale_add<<<blocks, threads, 0, stream>>>(x, 2.0f, 3.0f, threads);
    scale_add<<<blocks, threads, 0, stream>>>(x, 2.0f, 3.0f, threads);
    cudaGraph_t ended;
    CK(cudaStreamEndCapture(stream, &ended));
    EXPECT(ended == more, "capture into a graph returned another graph");
    CK(cudaGraphGetNodes(more, nullptr, &nodes));
    EXPECT(nodes == 3, "captured graph has %zu nodes, expected 3", nodes);
    cudaGraphExec_t more_exec;
    CK(cudaGraphInstantiate(&more_exec, more, 0));
    CK(cudaGraphLaunch(more_exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back.data(), x, bytes, cudaMemcpyDeviceToHost));
    EXPECT(back[0] == 49.0f, "captured x[0] = %g, expected 49", back[0]);
    printf("CHECK capture_to_graph %.6e\n", back[0]);

    // Graph memory: an allocation node, a memset and a kernel on it, a copy out, a free node;
    // launched twice (the driver gives the allocation the same address each time).
    cudaGraph_t mem;
    CK(cudaGraphCreate(&mem, 0));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = bytes;
    cudaGraphNode_t alloc_node, fill_node, kern_node, out_node, free_node;
    CK(cudaGraphAddMemAllocNode(&alloc_node, mem, nullptr, 0, &ap));
    float *scratch = (float *)ap.dptr;
    EXPECT(scratch != nullptr, "allocation node gave no address");
    cudaMemsetParams fill = {};
    fill.dst = scratch;
    fill.value = 0;
    fill.elementSize = 4;
    fill.width = n;
    fill.height = 1;
    CK(cudaGraphAddMemsetNode(&fill_node, mem, &alloc_node, 1, &fill));
    float a3 = 1.0f, b3 = 5.0f;
    int n3 = n;
    void *args3[] = {&scratch, &a3, &b3, &n3};
    cudaKernelNodeParams kp3 = {};
    kp3.func = (void *)scale_add;
    kp3.gridDim = dim3(blocks);
    kp3.blockDim = dim3(threads);
    kp3.kernelParams = args3;
    CK(cudaGraphAddKernelNode(&kern_node, mem, &fill_node, 1, &kp3));
    CK(cudaGraphAddMemcpyNode1D(&out_node, mem, &kern_node, 1, y, scratch, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaGraphAddMemFreeNode(&free_node, mem, &out_node, 1, scratch));
    cudaMemAllocNodeParams ap_back = {};
    CK(cudaGraphMemAllocNodeGetParams(alloc_node, &ap_back));
    void *freed_back = nullptr;
    CK(cudaGraphMemFreeNodeGetParams(free_node, &freed_back));
    printf("CHECK memory_node_params %d %zu %d %d %d\n", ap_back.dptr == scratch, ap_back.bytesize,
           (int)ap_back.poolProps.location.type, ap_back.poolProps.location.id,
           freed_back == scratch);
    cudaGraphExec_t mem_exec;
    CK(cudaGraphInstantiate(&mem_exec, mem, 0));
    for (int launch = 0; launch < 2; ++launch) {
        CK(cudaMemset(y, 0, bytes));
        CK(cudaGraphLaunch(mem_exec, stream));
        CK(cudaStreamSynchronize(stream));
        CK(cudaMemcpy(back.data(), y, bytes, cudaMemcpyDeviceToHost));
        EXPECT(back[0] == 5.0f && back[n - 1] == 5.0f, "graph memory: y = %g %g", back[0], back[n - 1]);
    }
    printf("CHECK graph_memory %.6e\n", back[n - 1]);
    // The device's graph memory: reserved while the executable graph keeps it, the high
    // watermark at least the allocation, then reset.
    unsigned long long used_high = 0, reserved = 0;
    CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &used_high));
    CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved));
    EXPECT(used_high >= bytes && reserved >= bytes, "graph memory: used high %llu, reserved %llu",
           used_high, reserved);
    unsigned long long reset = 0;
    CK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &reset));
    CK(cudaDeviceGraphMemTrim(0));
    printf("CHECK graph_memory_attributes %d\n", (int)(used_high >= bytes));

    // Copy nodes with a host side, built node by node: host -> device, kernel, device -> host.
    cudaGraph_t hostio;
    CK(cudaGraphCreate(&hostio, 0));
    std::vector<float> in(n), outv(n);
    cudaGraphNode_t up, work, down;
    CK(cudaGraphAddMemcpyNode1D(&up, hostio, nullptr, 0, x, in.data(), bytes, cudaMemcpyHostToDevice));
    float a4 = 2.0f, b4 = 0.5f;
    int n4 = n;
    void *args4[] = {&x, &a4, &b4, &n4};
    cudaKernelNodeParams kp4 = {};
    kp4.func = (void *)scale_add;
    kp4.gridDim = dim3(blocks);
    kp4.blockDim = dim3(threads);
    kp4.kernelParams = args4;
    CK(cudaGraphAddKernelNode(&work, hostio, &up, 1, &kp4));
    CK(cudaGraphAddMemcpyNode1D(&down, hostio, &work, 1, outv.data(), x, bytes, cudaMemcpyDeviceToHost));
    // A host node after the copy to the host: it sees the copied values.
    HostSeen seen = {outv.data() + (n - 1), 0, 0.0f};
    cudaHostNodeParams hp = {};
    hp.fn = on_host;
    hp.userData = &seen;
    cudaGraphNode_t host_node;
    CK(cudaGraphAddHostNode(&host_node, hostio, &down, 1, &hp));
    cudaHostNodeParams hp_back = {};
    CK(cudaGraphHostNodeGetParams(host_node, &hp_back));
    printf("CHECK host_node_params %d %d\n", hp_back.fn == hp.fn, hp_back.userData == hp.userData);
    cudaGraphExec_t hostio_exec;
    CK(cudaGraphInstantiate(&hostio_exec, hostio, 0));
    for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < n; ++i) in[i] = float(i + round);
        CK(cudaGraphLaunch(hostio_exec, stream));
        CK(cudaStreamSynchronize(stream));
        for (int i = 0; i < n; ++i)
            EXPECT(outv[i] == 2.0f * float(i + round) + 0.5f, "host copy nodes, round %d: out[%d] = %g",
                   round, i, outv[i]);
    }
    EXPECT(seen.calls == 2 && seen.value == outv[n - 1], "host node: %d calls, saw %g", seen.calls,
           seen.value);
    printf("CHECK host_copy_nodes %.6e %.6e\n", outv[n - 1], double(seen.calls));
    CK(cudaGraphExecDestroy(hostio_exec));
    CK(cudaGraphDestroy(hostio));
    CK(cudaGraphExecDestroy(mem_exec));
    CK(cudaGraphDestroy(mem));

    CK(cudaGraphExecDestroy(more_exec));
    CK(cudaGraphExecDestroy(loop_exec));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(more));
    CK(cudaGraphDestroy(loop));
    CK(cudaGraphDestroy(graph));
    CK(cudaGraphDestroy(child));
    printf("PASS graph_nodes\n");
    return 0;
}
