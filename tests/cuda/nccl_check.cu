// nccl_check: NCCL from one process over every distinct GPU it sees (by UUID: two rgpu
// servers on one machine show each GPU twice), or over the devices listed in its first
// argument ("0,3"). ncclCommInitAll, then in one group per collective: all-reduce (sum, and
// a pre-multiplied sum), broadcast, all-gather, reduce-scatter, reduce, a ring of sends and
// receives; each result summed on the host. Also the communicators' facts (count, device,
// rank), ncclCommSplit, an invalid datatype (ncclInvalidArgument), ncclGetErrorString, and
// ncclCommGetAsyncError.
//
//   nvcc -O2 -o nccl_check nccl_check.cu -lnccl && ./nccl_check
//
// Prints `CHECK <name> <values>` lines, then `PASS nccl_check`, or `FAIL nccl_check: why`.
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define PROG "nccl_check"
#include "check.h"

#define NC(call)                                                                          \
    do {                                                                                  \
        ncclResult_t r_ = (call);                                                         \
        EXPECT(r_ == ncclSuccess, "%s:%d: %s -> %d (%s)", __FILE__, __LINE__, #call, (int)r_, \
               ncclGetErrorString(r_));                                                   \
    } while (0)

#define N (1 << 20)

__global__ void fill(float *x, int n, float base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + (float)(i % 7);
}

static double host_sum(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += x[i];
    return s;
}

int main(int argc, char **argv) {
    int version = 0;
    NC(ncclGetVersion(&version));
    printf("NCCL version %d\n", version);

    std::vector<int> devices;
    if (argc > 1) {
        for (char *p = strtok(argv[1], ","); p; p = strtok(nullptr, ",")) devices.push_back(atoi(p));
    } else {
        int count = 0;
        CK(cudaGetDeviceCount(&count));
        std::vector<cudaUUID_t> seen;
        for (int d = 0; d < count; ++d) {
            cudaDeviceProp prop;
            CK(cudaGetDeviceProperties(&prop, d));
            bool again = false;
            for (auto &u : seen) again |= memcmp(&u, &prop.uuid, sizeof u) == 0;
            if (!again) {
                seen.push_back(prop.uuid);
                devices.push_back(d);
            }
        }
    }
    int n = (int)devices.size();
    printf("CHECK ranks %d\n", n);

    std::vector<ncclComm_t> comms(n);
    NC(ncclCommInitAll(comms.data(), n, devices.data()));
    int facts_ok = 1;
    for (int r = 0; r < n; ++r) {
        int count = -1, device = -1, rank = -1;
        NC(ncclCommCount(comms[r], &count));
        NC(ncclCommCuDevice(comms[r], &device));
        NC(ncclCommUserRank(comms[r], &rank));
        facts_ok &= count == n && device == devices[r] && rank == r;
    }
    printf("CHECK facts %d\n", facts_ok);

    std::vector<float *> send(n), recv(n), gathered(n);
    std::vector<cudaStream_t> streams(n);
    for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(devices[r]));
        CK(cudaStreamCreate(&streams[r]));
        CK(cudaMalloc(&send[r], N * sizeof(float)));
        CK(cudaMalloc(&recv[r], N * sizeof(float)));
        CK(cudaMalloc(&gathered[r], (size_t)N * n * sizeof(float)));
        fill<<<(N + 255) / 256, 256, 0, streams[r]>>>(send[r], N, (float)(r + 1));
        CK(cudaGetLastError());
    }
    std::vector<float> host((size_t)N * n);
    // The sum over ranks of each rank's first `count` elements of `buffers`.
    auto sum_of = [&](std::vector<float *> &buffers, size_t count) {
        double total = 0;
        for (int r = 0; r < n; ++r) {
            CK(cudaSetDevice(devices[r]));
            CK(cudaStreamSynchronize(streams[r]));
            CK(cudaMemcpy(host.data(), buffers[r], count * sizeof(float), cudaMemcpyDeviceToHost));
            total += host_sum(host.data(), count);
        }
        return total;
    };

    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r)
        NC(ncclAllReduce(send[r], recv[r], N, ncclFloat, ncclSum, comms[r], streams[r]));
    NC(ncclGroupEnd());
    printf("CHECK all_reduce %.6e\n", sum_of(recv, N));

    // A pre-multiplied sum (a scalar of each rank's own), then freed.
    NC(ncclGroupStart());
    std::vector<ncclRedOp_t> ops(n);
    for (int r = 0; r < n; ++r) {
        float scalar = 0.5f;
        NC(ncclRedOpCreatePreMulSum(&ops[r], &scalar, ncclFloat, ncclScalarHostImmediate, comms[r]));
    }
    NC(ncclGroupEnd());
    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r)
        NC(ncclAllReduce(send[r], recv[r], N, ncclFloat, ops[r], comms[r], streams[r]));
    NC(ncclGroupEnd());
    printf("CHECK pre_mul_sum %.6e\n", sum_of(recv, N));
    for (int r = 0; r < n; ++r) NC(ncclRedOpDestroy(ops[r], comms[r]));

    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r)
        NC(ncclBroadcast(send[r], recv[r], N, ncclFloat, n - 1, comms[r], streams[r]));
    NC(ncclGroupEnd());
    printf("CHECK broadcast %.6e\n", sum_of(recv, N));

    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r)
        NC(ncclAllGather(send[r], gathered[r], N, ncclFloat, comms[r], streams[r]));
    NC(ncclGroupEnd());
    printf("CHECK all_gather %.6e\n", sum_of(gathered, (size_t)N * n));

    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r)
        NC(ncclReduceScatter(gathered[r], recv[r], N, ncclFloat, ncclMax, comms[r], streams[r]));
    NC(ncclGroupEnd());
    printf("CHECK reduce_scatter %.6e\n", sum_of(recv, N));

    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r)
        NC(ncclReduce(send[r], recv[r], N, ncclFloat, ncclMin, 0, comms[r], streams[r]));
    NC(ncclGroupEnd());
    CK(cudaSetDevice(devices[0]));
    CK(cudaStreamSynchronize(streams[0]));
    CK(cudaMemcpy(host.data(), recv[0], N * sizeof(float), cudaMemcpyDeviceToHost));
    printf("CHECK reduce %.6e\n", host_sum(host.data(), N));

    // A ring: each rank sends to the next and receives from the previous.
    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r) {
        NC(ncclSend(send[r], N, ncclFloat, (r + 1) % n, comms[r], streams[r]));
        NC(ncclRecv(recv[r], N, ncclFloat, (r + n - 1) % n, comms[r], streams[r]));
    }
    NC(ncclGroupEnd());
    printf("CHECK ring %.6e\n", sum_of(recv, N));

    // Errors: an invalid datatype, a root out of range; the async error stays clear.
    ncclResult_t bad = ncclAllReduce(send[0], recv[0], N, (ncclDataType_t)99, ncclSum, comms[0],
                                     streams[0]);
    ncclResult_t bad_root = ncclBroadcast(send[0], recv[0], N, ncclFloat, n, comms[0], streams[0]);
    ncclResult_t async = ncclInProgress;
    NC(ncclCommGetAsyncError(comms[0], &async));
    printf("CHECK errors %d %d %d %s\n", (int)bad, (int)bad_root, (int)async,
           ncclGetErrorString(ncclInvalidArgument));

    // Split: even ranks in one communicator, odd ones in another.
    std::vector<ncclComm_t> halves(n);
    NC(ncclGroupStart());
    for (int r = 0; r < n; ++r) NC(ncclCommSplit(comms[r], r % 2, r, &halves[r], nullptr));
    NC(ncclGroupEnd());
    int split_sizes = 0;
    for (int r = 0; r < n; ++r) {
        int count = 0;
        NC(ncclCommCount(halves[r], &count));
        split_sizes = split_sizes * 10 + count;
    }
    printf("CHECK split %d\n", split_sizes);
    for (int r = 0; r < n; ++r) NC(ncclCommDestroy(halves[r]));

    for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(devices[r]));
        CK(cudaStreamSynchronize(streams[r]));
        NC(ncclCommDestroy(comms[r]));
        CK(cudaFree(send[r]));
        CK(cudaFree(recv[r]));
        CK(cudaFree(gathered[r]));
        CK(cudaStreamDestroy(streams[r]));
    }
    printf("PASS nccl_check\n");
    return 0;
}
