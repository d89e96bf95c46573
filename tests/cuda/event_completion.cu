// event_completion: what querying an event says once the work it marks has completed, after it
// is recorded again behind a long kernel, after a graph that records it is launched, and after a
// device-wide synchronization. Through rgpu the client answers the queries of events it knows
// complete without the server (docs/latency.md); this program checks the answers are the
// driver's in every case where that knowledge must not be used.
//
//   nvcc -O2 -o event_completion event_completion.cu && ./event_completion
//
// Prints `CHECK <name> <values>` lines, then `PASS event_completion`, or
// `FAIL event_completion: why` and exit status 1.
#include <cuda_runtime.h>
#include <cstdio>

#define PROG "event_completion"
#include "check.h"

// Keeps one thread busy for `cycles` clock cycles.
__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

int main() {
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    const long long long_spin = (long long)khz * 300;  // ~300 ms
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e;
    CK(cudaEventCreate(&e));

    // 1. Recorded, then its stream synchronized: complete, however often asked.
    spin<<<1, 1, 0, s>>>(1000);
    CK(cudaEventRecord(e, s));
    CK(cudaStreamSynchronize(s));
    int complete = 0;
    for (int i = 0; i < 100; ++i) complete += cudaEventQuery(e) == cudaSuccess;
    CK(cudaEventSynchronize(e));
    printf("CHECK after_stream_sync %d\n", complete);

    // 2. Recorded again behind a long kernel: not ready until synchronized.
    spin<<<1, 1, 0, s>>>(long_spin);
    CK(cudaEventRecord(e, s));
    cudaError_t pending = cudaEventQuery(e);
    CK(cudaEventSynchronize(e));
    printf("CHECK re_recorded %d %d\n", pending == cudaErrorNotReady, cudaEventQuery(e) == cudaSuccess);

    // 3. A graph with a long kernel and then a record of the event: once it is launched, the
    //    event is not ready (although it was complete before), until the stream is synchronized.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    spin<<<1, 1, 0, s>>>(long_spin);
    CK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaStreamSynchronize(s));
    cudaError_t before = cudaEventQuery(e);
    CK(cudaGraphLaunch(exec, s));
    cudaError_t launched = cudaEventQuery(e);
    CK(cudaStreamSynchronize(s));
    printf("CHECK graph %d %d %d\n", before == cudaSuccess, launched == cudaErrorNotReady,
           cudaEventQuery(e) == cudaSuccess);

    // 4. Recorded, then the whole device synchronized: complete.
    spin<<<1, 1, 0, s>>>(1000);
    CK(cudaEventRecord(e, s));
    CK(cudaDeviceSynchronize());
    complete = 0;
    for (int i = 0; i < 100; ++i) complete += cudaEventQuery(e) == cudaSuccess;
    printf("CHECK after_device_sync %d\n", complete);

    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(s));
    printf("PASS event_completion\n");
    return 0;
}
