/* rgpu_mpi_bench: OSU-style MPI latency and bandwidth between ranks 0 and 1, for `rgpu bench
 * mpi` (which runs it under mpirun with `rgpu run --mpi`). Modes, each over the same sizes:
 *
 *   host   host buffers on both ranks: the MPI link itself (the raw link of this run);
 *   staged rgpu device buffers on both ranks (OpenCL buffers marked by their datatype, or CUDA
 *          device memory), staged through the ranks' host memory by librgpu_mpi.so;
 *   direct the same, messages of 64 KiB or more moved between the servers directly.
 *
 * Latency: ping-pong, half the round trip. Bandwidth: a window of 64 non-blocking sends (fewer
 * for messages over 16 MiB: at most 1 GiB in flight), then an acknowledgement, repeated. One JSON object per line on rank 0's stdout:
 *   {"mode":"host","test":"latency","bytes":8,"us":12.3}
 *   {"mode":"device","test":"bandwidth","bytes":65536,"mbps":812.0}
 *
 * Collectives (--allreduce-sizes, none by default): MPI_Allreduce of float sums, the time per
 * call (the slower rank's mean over the iterations), in modes host (host buffers), staged
 * (device buffers through host memory) and nccl (device buffers, NCCL on the servers):
 *   {"mode":"nccl","test":"allreduce","bytes":1048576,"us":45.6}
 *
 *   rgpu_mpi_bench --api opencl|cuda [--latency-sizes a,b,..] [--bandwidth-sizes a,b,..]
 *                  [--allreduce-sizes a,b,..] [--iterations N] [--modes host,staged,direct]
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_mpi.h"

#define WINDOW 64

static int rank;

#define DIE(...)                                   \
    do {                                           \
        fprintf(stderr, "rgpu_mpi_bench: " __VA_ARGS__); \
        fprintf(stderr, "\n");                     \
        MPI_Abort(MPI_COMM_WORLD, 2);              \
    } while (0)

/* ---- device buffers ---------------------------------------------------------------------- */

static int use_cuda;
static cl_context context;
static cl_command_queue queue;
static MPI_Datatype cl_byte;

typedef int (*CuInit)(unsigned);
typedef int (*CuDeviceGet)(int *, int);
typedef int (*CuDeviceGetCount)(int *);
typedef int (*CuPrimaryCtxRetain)(void **, int);
typedef int (*CuCtxSetCurrent)(void *);
typedef int (*CuMemAlloc)(uint64_t *, size_t);
typedef int (*CuMemFree)(uint64_t);
typedef int (*CuMemsetD8)(uint64_t, unsigned char, size_t);
static CuMemAlloc cu_mem_alloc;
static CuMemFree cu_mem_free;
static CuMemsetD8 cu_memset;

static void open_cuda(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda) DIE("no libcuda.so.1: %s", dlerror());
    CuInit init = (CuInit)dlsym(cuda, "cuInit");
    CuDeviceGetCount count = (CuDeviceGetCount)dlsym(cuda, "cuDeviceGetCount");
    CuDeviceGet get = (CuDeviceGet)dlsym(cuda, "cuDeviceGet");
    CuPrimaryCtxRetain retain = (CuPrimaryCtxRetain)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    CuCtxSetCurrent set_current = (CuCtxSetCurrent)dlsym(cuda, "cuCtxSetCurrent");
    cu_mem_alloc = (CuMemAlloc)dlsym(cuda, "cuMemAlloc_v2");
    cu_mem_free = (CuMemFree)dlsym(cuda, "cuMemFree_v2");
    cu_memset = (CuMemsetD8)dlsym(cuda, "cuMemsetD8_v2");
    int n = 0, device = 0;
    void *ctx = NULL;
    if (!init || init(0) || count(&n) || n < 1) DIE("no CUDA device");
    /* The primary context, as programs of the CUDA runtime (and NCCL) use. */
    if (get(&device, rank % n) || retain(&ctx, device) || set_current(ctx))
        DIE("cannot make a CUDA context");
}

static void open_opencl(void) {
    cl_platform_id platforms[16];
    cl_uint n = 0;
    clGetPlatformIDs(16, platforms, &n);
    for (cl_uint i = 0; i < n; ++i) {
        char name[64] = "";
        clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strcmp(name, "rgpu")) continue;
        cl_device_id devices[64];
        cl_uint count = 0;
        if (clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_ALL, 64, devices, &count) || !count) break;
        cl_int e;
        cl_device_id device = devices[rank % count];
        context = clCreateContext(NULL, 1, &device, NULL, NULL, &e);
        queue = clCreateCommandQueueWithProperties(context, device, NULL, &e);
        if (e) DIE("cannot make an OpenCL queue (%d)", e);
        if (rgpu_mpi_opencl_type(MPI_BYTE, queue, &cl_byte) != MPI_SUCCESS) DIE("no marked datatype");
        return;
    }
    DIE("no rgpu OpenCL device");
}

/* A buffer of `bytes` for `mode` (0 host, 1 device), its datatype, and how to free it. */
typedef struct {
    void *address;
    MPI_Datatype type;
    int device;
} Buffer;

static Buffer make_buffer(int device, size_t bytes) {
    Buffer b = {NULL, MPI_BYTE, device};
    if (!device) {
        b.address = malloc(bytes);
        memset(b.address, 1, bytes);
    } else if (use_cuda) {
        uint64_t ptr = 0;
        if (cu_mem_alloc(&ptr, bytes) || cu_memset(ptr, 1, bytes)) DIE("cuMemAlloc of %zu failed", bytes);
        b.address = (void *)(uintptr_t)ptr;
    } else {
        cl_int e;
        cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &e);
        unsigned char one = 1;
        if (e || clEnqueueFillBuffer(queue, m, &one, 1, 0, bytes, 0, NULL, NULL) || clFinish(queue))
            DIE("clCreateBuffer of %zu failed", bytes);
        b.address = m;
        b.type = cl_byte;
    }
    return b;
}

static void free_buffer(Buffer b) {
    if (!b.device) free(b.address);
    else if (use_cuda) cu_mem_free((uint64_t)(uintptr_t)b.address);
    else clReleaseMemObject((cl_mem)b.address);
}

/* ---- the tests ------------------------------------------------------------------------------ */

static double latency_us(int device, size_t bytes, int iterations) {
    Buffer b = make_buffer(device, bytes);
    int peer = 1 - rank, warmup = iterations / 10 + 1;
    double t0 = 0;
    for (int i = 0; i < warmup + iterations; ++i) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank == 0) {
            MPI_Send(b.address, (int)bytes, b.type, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(b.address, (int)bytes, b.type, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(b.address, (int)bytes, b.type, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(b.address, (int)bytes, b.type, peer, 1, MPI_COMM_WORLD);
        }
    }
    double us = (MPI_Wtime() - t0) * 1e6 / (2.0 * iterations);
    free_buffer(b);
    return us;
}

static double bandwidth_mbps(int device, size_t bytes, int iterations) {
    Buffer b = make_buffer(device, bytes);
    int peer = 1 - rank, warmup = 1;
    /* At most 1 GiB in flight per window (staging holds a copy of each message). */
    int window = (int)(((size_t)1 << 30) / bytes);
    if (window > WINDOW) window = WINDOW;
    if (window < 1) window = 1;
    MPI_Request requests[WINDOW];
    char ack = 0;
    double t0 = 0;
    for (int i = 0; i < warmup + iterations; ++i) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        for (int w = 0; w < window; ++w) {
            if (rank == 0)
                MPI_Isend(b.address, (int)bytes, b.type, peer, 2, MPI_COMM_WORLD, &requests[w]);
            else
                MPI_Irecv(b.address, (int)bytes, b.type, peer, 2, MPI_COMM_WORLD, &requests[w]);
        }
        MPI_Waitall(window, requests, MPI_STATUSES_IGNORE);
        if (rank == 0)
            MPI_Recv(&ack, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
            MPI_Send(&ack, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
    }
    double seconds = MPI_Wtime() - t0;
    free_buffer(b);
    return (double)bytes * window * iterations / seconds / 1e6;
}

/* Microseconds per MPI_Allreduce of `bytes` of floats (summed), the slower rank's. */
static double allreduce_us(int device, size_t bytes, int iterations) {
    Buffer send = make_buffer(device, bytes), recv = make_buffer(device, bytes);
    MPI_Datatype type = MPI_FLOAT;
    if (device && !use_cuda) rgpu_mpi_opencl_type(MPI_FLOAT, queue, &type);
    int count = (int)(bytes / sizeof(float)), warmup = iterations / 10 + 1;
    double t0 = 0;
    for (int i = 0; i < warmup + iterations; ++i) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        MPI_Allreduce(send.address, recv.address, count, type, MPI_SUM, MPI_COMM_WORLD);
    }
    double us = (MPI_Wtime() - t0) * 1e6 / iterations, slowest = 0;
    MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (type != MPI_FLOAT) MPI_Type_free(&type);
    free_buffer(send);
    free_buffer(recv);
    return slowest;
}

/* Rounds that move about `budget` bytes at `per_round` bytes each, within [least, most]. */
static int rounds_for(size_t budget, size_t per_round, int least, int most) {
    long rounds = (long)(budget / per_round);
    if (rounds < least) rounds = least;
    if (rounds > most) rounds = most;
    return (int)rounds;
}

static int parse_sizes(const char *list, size_t *out, int max) {
    int n = 0;
    char *copy = strdup(list), *save = NULL;
    for (char *s = strtok_r(copy, ",", &save); s && n < max; s = strtok_r(NULL, ",", &save))
        out[n++] = strtoull(s, NULL, 0);
    free(copy);
    return n;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks != 2) DIE("runs with exactly 2 ranks");
    size_t latency_sizes[32], bandwidth_sizes[32], allreduce_sizes[32];
    int na = 0;
    int nl = parse_sizes("8,64,512,4096", latency_sizes, 32);
    int nb = parse_sizes("65536,1048576,16777216,67108864,268435456", bandwidth_sizes, 32);
    int iterations = 100, modes = 7; /* bit 0 host, bit 1 staged, bit 2 direct */
    for (int i = 1; i < argc; ++i) {
        const char *value = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--api")) use_cuda = !strcmp(value, "cuda"), ++i;
        else if (!strcmp(argv[i], "--latency-sizes")) nl = parse_sizes(value, latency_sizes, 32), ++i;
        else if (!strcmp(argv[i], "--bandwidth-sizes")) nb = parse_sizes(value, bandwidth_sizes, 32), ++i;
        else if (!strcmp(argv[i], "--allreduce-sizes")) na = parse_sizes(value, allreduce_sizes, 32), ++i;
        else if (!strcmp(argv[i], "--iterations")) iterations = atoi(value), ++i;
        else if (!strcmp(argv[i], "--modes"))
            modes = (strstr(value, "host") ? 1 : 0) | (strstr(value, "staged") ? 2 : 0) |
                    (strstr(value, "direct") ? 4 : 0),
            ++i;
        else DIE("unknown argument %s", argv[i]);
    }
    if (modes & 6) {
        if (use_cuda) open_cuda();
        else open_opencl();
    }
    const char *names[] = {"host", "staged", "direct"};
    for (int mode = 0; mode < 3; ++mode) {
        if (!(modes & (1 << mode))) continue;
        rgpu_mpi_set_direct(mode == 2);
        for (int i = 0; i < nl; ++i) {
            double us = latency_us(mode != 0, latency_sizes[i], iterations);
            if (rank == 0)
                printf("{\"mode\":\"%s\",\"test\":\"latency\",\"bytes\":%zu,\"us\":%.3f}\n",
                       names[mode], latency_sizes[i], us);
        }
        for (int i = 0; i < nb; ++i) {
            /* Fewer rounds for large sizes: about 1 GiB moved per size, at least 2 rounds. */
            int rounds = rounds_for((size_t)1 << 30, bandwidth_sizes[i] * WINDOW, 2, iterations);
            double mbps = bandwidth_mbps(mode != 0, bandwidth_sizes[i], rounds);
            if (rank == 0)
                printf("{\"mode\":\"%s\",\"test\":\"bandwidth\",\"bytes\":%zu,\"mbps\":%.1f}\n",
                       names[mode], bandwidth_sizes[i], mbps);
        }
        fflush(stdout);
    }
    /* Collectives: host buffers, then device buffers staged, then on NCCL. */
    const char *collective_modes[] = {"host", "staged", "nccl"};
    for (int mode = 0; mode < 3 && na > 0; ++mode) {
        if (mode > 0 && !(modes & 6)) break;
        rgpu_mpi_set_nccl(mode == 2);
        for (int i = 0; i < na; ++i) {
            /* About 4 GiB reduced per size, at least 3 rounds. */
            int rounds = rounds_for((size_t)4 << 30, allreduce_sizes[i] + 1, 3, iterations);
            double us = allreduce_us(mode != 0, allreduce_sizes[i], rounds);
            if (rank == 0)
                printf("{\"mode\":\"%s\",\"test\":\"allreduce\",\"bytes\":%zu,\"us\":%.3f}\n",
                       collective_modes[mode], allreduce_sizes[i], us);
        }
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
