// graph_capture: stream captures that reach past one stream, as NVIDIA's graphMemoryNodes and
// graphConditionalNodes samples make them.
//  1. Fork and join: a capture with stream-ordered allocations and frees (memory nodes); a
//     second stream joins it by waiting on an event recorded in it, copies device to pageable
//     host memory there, frees there, and joins back; the second stream is destroyed while
//     the capture goes on. The graph is launched twice, results checked on the host.
//  2. A capture that ends with a conditional node: the graph being captured and the stream's
//     dependencies are read with cudaStreamGetCaptureInfo, a conditional handle made on that
//     graph, a while node added to it and made the stream's dependency with
//     cudaStreamUpdateCaptureDependencies; after the capture, the while node's body is
//     captured into its body graph (cudaStreamBeginCaptureToGraph). The loop runs N times.
//
//   nvcc -O2 -o graph_capture graph_capture.cu && ./graph_capture
//
// Prints `CHECK` lines, then `PASS graph_capture`, or `FAIL graph_capture: why` and exit
// status 1.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "graph_capture"
#include "check.h"

#define N 4096
#define LOOPS 7

__global__ void square(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * in[i];
}

__global__ void negate(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = -in[i];
}

// The loop: counts down, and ends the while node at zero.
__global__ void loop_start(int *counter, int *steps) {
    *counter = LOOPS;
    *steps = 0;
}

__global__ void loop_body(cudaGraphConditionalHandle handle, int *counter, int *steps) {
    *steps += 1;
    if (--*counter == 0) cudaGraphSetConditional(handle, 0);
}

__global__ void after_loop(int *steps) { *steps += 100; }

static double sum(const std::vector<float> &x) {
    double s = 0;
    for (float v : x) s += v;
    return s;
}

// Part 1: the work of graphMemoryNodes' doNegateSquaresInStream, captured on `s1`.
static void negate_squares(cudaStream_t s1, const std::vector<float> &input,
                           std::vector<float> &squares, std::vector<float> &negated) {
    size_t bytes = N * sizeof(float);
    cudaStream_t s2;
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t squared, negated_done, freed;
    CK(cudaEventCreate(&squared));
    CK(cudaEventCreate(&negated_done));
    CK(cudaEventCreate(&freed));
    float *d_in, *d_sq, *d_neg;
    CK(cudaMallocAsync(&d_in, bytes, s1));
    CK(cudaMallocAsync(&d_sq, bytes, s1));
    CK(cudaMemcpyAsync(d_in, input.data(), bytes, cudaMemcpyHostToDevice, s1));
    square<<<(N + 255) / 256, 256, 0, s1>>>(d_in, d_sq, N);
    CK(cudaEventRecord(squared, s1));
    // The second stream joins the capture here.
    CK(cudaStreamWaitEvent(s2, squared, 0));
    cudaStreamCaptureStatus joined;
    CK(cudaStreamIsCapturing(s2, &joined));
    printf("CHECK joined_stream_capturing %d\n", (int)joined);
    CK(cudaMemcpyAsync(squares.data(), d_sq, bytes, cudaMemcpyDeviceToHost, s2));
    CK(cudaFreeAsync(d_in, s1));
    CK(cudaMallocAsync(&d_neg, bytes, s1));
    negate<<<(N + 255) / 256, 256, 0, s1>>>(d_sq, d_neg, N);
    CK(cudaEventRecord(negated_done, s1));
    CK(cudaMemcpyAsync(negated.data(), d_neg, bytes, cudaMemcpyDeviceToHost, s1));
    CK(cudaFreeAsync(d_neg, s1));
    CK(cudaStreamWaitEvent(s2, negated_done, 0));
    CK(cudaFreeAsync(d_sq, s2));
    CK(cudaEventRecord(freed, s2));
    // And joins back.
    CK(cudaStreamWaitEvent(s1, freed, 0));
    CK(cudaStreamDestroy(s2));
    CK(cudaEventDestroy(squared));
    CK(cudaEventDestroy(negated_done));
    CK(cudaEventDestroy(freed));
}

static void fork_and_join() {
    std::vector<float> input(N), squares(N, 0.f), negated(N, 0.f);
    for (int i = 0; i < N; ++i) input[i] = (float)(i % 97) * 0.25f;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    negate_squares(s, input, squares, negated);
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(s, &graph));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    printf("CHECK fork_join_nodes %zu\n", nodes);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 2; ++launch) {
        std::fill(squares.begin(), squares.end(), 0.f);
        std::fill(negated.begin(), negated.end(), 0.f);
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        printf("CHECK fork_join_launch%d %.6e %.6e\n", launch, sum(squares), sum(negated));
    }
    // No stream is left capturing.
    cudaStreamCaptureStatus after;
    CK(cudaStreamIsCapturing(s, &after));
    printf("CHECK capture_over %d\n", (int)after);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
}

// Part 2: graphConditionalNodes' capturedWhileGraph, with a counter.
static void captured_while() {
    int *d_counter, *d_steps;
    CK(cudaMalloc(&d_counter, sizeof(int)));
    CK(cudaMalloc(&d_steps, sizeof(int)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    loop_start<<<1, 1, 0, s>>>(d_counter, d_steps);

    cudaStreamCaptureStatus status;
    cudaGraph_t graph;
    const cudaGraphNode_t *deps = nullptr;
    size_t ndeps = 0;
#if CUDART_VERSION >= 13000
    CK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &ndeps));
#else
    CK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, &ndeps));
#endif
    printf("CHECK capture_info %d %zu\n", (int)status, ndeps);
    cudaGraphNodeType kind;
    CK(cudaGraphNodeGetType(deps[0], &kind));
    printf("CHECK capture_dependency_type %d\n", (int)kind);

    cudaGraphConditionalHandle handle;
    CK(cudaGraphConditionalHandleCreate(&handle, graph, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams params = {};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle;
    params.conditional.type = cudaGraphCondTypeWhile;
    params.conditional.size = 1;
    cudaGraphNode_t loop;
#if CUDART_VERSION >= 13000
    CK(cudaGraphAddNode(&loop, graph, deps, nullptr, ndeps, &params));
    CK(cudaStreamUpdateCaptureDependencies(s, &loop, nullptr, 1, cudaStreamSetCaptureDependencies));
#else
    CK(cudaGraphAddNode(&loop, graph, deps, ndeps, &params));
    CK(cudaStreamUpdateCaptureDependencies(s, &loop, 1, cudaStreamSetCaptureDependencies));
#endif
    cudaGraph_t body = params.conditional.phGraph_out[0];
    after_loop<<<1, 1, 0, s>>>(d_steps);
    cudaGraph_t ended;
    CK(cudaStreamEndCapture(s, &ended));
    printf("CHECK capture_graph_same %d\n", ended == graph);

    // The body, captured into the while node's body graph.
    cudaStream_t body_stream;
    CK(cudaStreamCreateWithFlags(&body_stream, cudaStreamNonBlocking));
    CK(cudaStreamBeginCaptureToGraph(body_stream, body, nullptr, nullptr, 0,
                                     cudaStreamCaptureModeRelaxed));
    loop_body<<<1, 1, 0, body_stream>>>(handle, d_counter, d_steps);
    CK(cudaStreamEndCapture(body_stream, nullptr));
    CK(cudaStreamDestroy(body_stream));

    size_t nodes = 0;
    CK(cudaGraphGetNodes(ended, nullptr, &nodes));
    printf("CHECK while_graph_nodes %zu\n", nodes);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, ended, 0));
    for (int launch = 0; launch < 2; ++launch) {
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        int steps = 0, counter = -1;
        CK(cudaMemcpy(&steps, d_steps, sizeof steps, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&counter, d_counter, sizeof counter, cudaMemcpyDeviceToHost));
        printf("CHECK while_launch%d %d %d\n", launch, steps, counter);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(ended));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d_counter));
    CK(cudaFree(d_steps));
}

int main() {
    CK(cudaFree(0));
    fork_and_join();
    captured_while();
    printf("PASS graph_capture\n");
    return 0;
}
