/* mpi_buffers: MPI calls on rgpu OpenCL buffers (marked by their datatype, rgpu_mpi.h), run
 * under mpirun with `rgpu run --mpi`. Each rank uses device (rank % devices) of the rgpu
 * platform. Checks, with every result read back from the device:
 *   device -> device, device -> host and host -> device MPI_Send/MPI_Recv of odd sizes;
 *   many concurrent MPI_Isend/MPI_Irecv, small and large, completed by MPI_Waitall,
 *   MPI_Waitany and MPI_Testall; MPI_Sendrecv around a ring; a large MPI_Irecv into host memory
 *   from a device buffer; MPI_Bcast; MPI_Allreduce (sum of float and double, in place and not).
 * Messages of 64 KiB or more between device buffers move between the servers directly (unless
 * RGPU_MPI_DIRECT=0), smaller ones staged.
 * Prints `PASS mpi_buffers rank R` per rank, or `FAIL mpi_buffers rank R: why` and exits 1.
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../mpi/rgpu_mpi.h"

static int rank, ranks;
static cl_context context;
static cl_command_queue queue;

#define FAIL(...)                                               \
    do {                                                        \
        printf("FAIL mpi_buffers rank %d: ", rank);             \
        printf(__VA_ARGS__);                                    \
        printf("\n");                                           \
        fflush(stdout);                                         \
        MPI_Abort(MPI_COMM_WORLD, 1);                           \
    } while (0)
#define CL(call)                                                           \
    do {                                                                   \
        cl_int e_ = (call);                                                \
        if (e_ != CL_SUCCESS) FAIL("%s:%d: %s -> %d", __FILE__, __LINE__, #call, e_); \
    } while (0)
#define MPI(call)                                                            \
    do {                                                                     \
        int e_ = (call);                                                     \
        if (e_ != MPI_SUCCESS) FAIL("%s:%d: %s -> %d", __FILE__, __LINE__, #call, e_); \
    } while (0)

static cl_mem buffer(size_t bytes) {
    cl_int e;
    cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &e);
    CL(e);
    return m;
}

static void fill(cl_mem m, const void *data, size_t bytes) {
    CL(clEnqueueWriteBuffer(queue, m, CL_TRUE, 0, bytes, data, 0, NULL, NULL));
}

static void read_back(cl_mem m, void *data, size_t bytes) {
    CL(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, bytes, data, 0, NULL, NULL));
}

/* The pattern rank `from` sends in message `k`: byte i. */
static unsigned char pattern(int from, int k, size_t i) { return (unsigned char)(from * 31 + k * 7 + i * 13); }

static void check_pattern(const unsigned char *got, size_t n, int from, int k, const char *what) {
    for (size_t i = 0; i < n; ++i)
        if (got[i] != pattern(from, k, i))
            FAIL("%s: byte %zu of %zu is %u, not %u", what, i, n, got[i], pattern(from, k, i));
}

static unsigned char *patterned(size_t n, int from, int k) {
    unsigned char *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; ++i) p[i] = pattern(from, k, i);
    return p;
}

/* Sizes of the concurrent messages: small ones (staged) and large ones (moved between the
 * servers directly), interleaved. */
static size_t many_size(int k) { return (k % 2 ? 70000 * (size_t)k : 1000 * (size_t)k) + 3; }

static void pick_device(void) {
    cl_uint n = 0;
    CL(clGetPlatformIDs(0, NULL, &n));
    cl_platform_id *platforms = malloc(n * sizeof *platforms);
    CL(clGetPlatformIDs(n, platforms, NULL));
    cl_platform_id rgpu = NULL;
    for (cl_uint i = 0; i < n; ++i) {
        char name[256] = "";
        clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (!strcmp(name, "rgpu")) rgpu = platforms[i];
    }
    if (!rgpu) FAIL("no rgpu platform");
    cl_uint devices = 0;
    CL(clGetDeviceIDs(rgpu, CL_DEVICE_TYPE_ALL, 0, NULL, &devices));
    cl_device_id *ids = malloc(devices * sizeof *ids);
    CL(clGetDeviceIDs(rgpu, CL_DEVICE_TYPE_ALL, devices, ids, NULL));
    cl_device_id device = ids[rank % devices];
    cl_int e;
    context = clCreateContext(NULL, 1, &device, NULL, NULL, &e);
    CL(e);
    queue = clCreateCommandQueueWithProperties(context, device, NULL, &e);
    CL(e);
    free(ids);
    free(platforms);
}

int main(int argc, char **argv) {
    MPI(MPI_Init(&argc, &argv));
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks < 2) FAIL("needs 2 ranks or more");
    pick_device();
    MPI_Datatype cl_byte, cl_float, cl_double;
    MPI(rgpu_mpi_opencl_type(MPI_BYTE, queue, &cl_byte));
    MPI(rgpu_mpi_opencl_type(MPI_FLOAT, queue, &cl_float));
    MPI(rgpu_mpi_opencl_type(MPI_DOUBLE, queue, &cl_double));
    const size_t sizes[] = {1, 7, 4096, 1000003, 3 << 20};
    const int nsizes = sizeof sizes / sizeof *sizes;
    int peer = rank ^ 1;
    int paired = peer < ranks;

    /* Device -> device, device -> host and host -> device, between ranks 2k and 2k+1. */
    for (int s = 0; paired && s < nsizes; ++s) {
        size_t n = sizes[s];
        cl_mem m = buffer(n);
        unsigned char *host = malloc(n), *mine = patterned(n, rank, s);
        if (rank % 2 == 0) {
            fill(m, mine, n);
            MPI(MPI_Send(m, (int)n, cl_byte, peer, s, MPI_COMM_WORLD));         /* to a device */
            MPI(MPI_Send(m, (int)n, cl_byte, peer, 100 + s, MPI_COMM_WORLD));   /* to the host */
            MPI(MPI_Recv(m, (int)n, cl_byte, peer, 200 + s, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            read_back(m, host, n);
            check_pattern(host, n, peer, s, "host -> device");
        } else {
            MPI_Status status;
            MPI(MPI_Recv(m, (int)n, cl_byte, peer, s, MPI_COMM_WORLD, &status));
            int count = -1;
            MPI_Get_count(&status, MPI_BYTE, &count);
            if (count != (int)n) FAIL("device -> device: received %d bytes, not %zu", count, n);
            read_back(m, host, n);
            check_pattern(host, n, peer, s, "device -> device");
            MPI(MPI_Recv(host, (int)n, MPI_BYTE, peer, 100 + s, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            check_pattern(host, n, peer, s, "device -> host");
            MPI(MPI_Send(mine, (int)n, MPI_BYTE, peer, 200 + s, MPI_COMM_WORLD));
        }
        free(host);
        free(mine);
        clReleaseMemObject(m);
    }

    /* Many at once: 16 messages each way, of different sizes, completed three ways. */
    enum { MANY = 16 };
    cl_mem out[MANY], in[MANY];
    MPI_Request requests[2 * MANY];
    for (int round = 0; paired && round < 3; ++round) {
        for (int k = 0; k < MANY; ++k) {
            size_t n = many_size(k);
            out[k] = buffer(n);
            in[k] = buffer(n);
            unsigned char *mine = patterned(n, rank, k);
            fill(out[k], mine, n);
            free(mine);
            MPI(MPI_Irecv(in[k], (int)n, cl_byte, peer, k, MPI_COMM_WORLD, &requests[k]));
        }
        for (int k = 0; k < MANY; ++k)
            MPI(MPI_Isend(out[k], (int)many_size(k), cl_byte, peer, k, MPI_COMM_WORLD,
                          &requests[MANY + k]));
        if (round == 0) {
            MPI(MPI_Waitall(2 * MANY, requests, MPI_STATUSES_IGNORE));
        } else if (round == 1) {
            for (int done = 0; done < 2 * MANY; ++done) {
                int index;
                MPI(MPI_Waitany(2 * MANY, requests, &index, MPI_STATUS_IGNORE));
            }
        } else {
            int flag = 0;
            while (!flag) MPI(MPI_Testall(2 * MANY, requests, &flag, MPI_STATUSES_IGNORE));
        }
        for (int k = 0; k < MANY; ++k) {
            size_t n = many_size(k);
            unsigned char *got = malloc(n);
            read_back(in[k], got, n);
            check_pattern(got, n, peer, k, round == 0 ? "Waitall" : round == 1 ? "Waitany" : "Testall");
            free(got);
            clReleaseMemObject(out[k]);
            clReleaseMemObject(in[k]);
        }
    }

    /* A ring of MPI_Sendrecv, small and large. */
    for (size_t n = 12345; n < 2000000; n *= 40) {
        cl_mem send = buffer(n), recv = buffer(n);
        unsigned char *mine = patterned(n, rank, 77), *got = malloc(n);
        fill(send, mine, n);
        int right = (rank + 1) % ranks, left = (rank + ranks - 1) % ranks;
        MPI(MPI_Sendrecv(send, (int)n, cl_byte, right, 5, recv, (int)n, cl_byte, left, 5,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        read_back(recv, got, n);
        check_pattern(got, n, left, 77, "Sendrecv");
        free(mine);
        free(got);
        clReleaseMemObject(send);
        clReleaseMemObject(recv);
    }
    /* A large host receive from a device buffer, through MPI_Irecv. */
    if (paired) {
        size_t n = 500001;
        unsigned char *got = malloc(n), *mine = patterned(n, rank, 55);
        cl_mem m = buffer(n);
        fill(m, mine, n);
        MPI_Request r[2];
        MPI(MPI_Irecv(got, (int)n, MPI_BYTE, peer, 55, MPI_COMM_WORLD, &r[0]));
        MPI(MPI_Isend(m, (int)n, cl_byte, peer, 55, MPI_COMM_WORLD, &r[1]));
        MPI_Status st[2];
        MPI(MPI_Waitall(2, r, st));
        int count = -1;
        MPI_Get_count(&st[0], MPI_BYTE, &count);
        if (count != (int)n) FAIL("Irecv into host memory: count %d, not %zu", count, n);
        check_pattern(got, n, peer, 55, "Irecv into host memory");
        free(got);
        free(mine);
        clReleaseMemObject(m);
    }

    /* Broadcast from rank 0's device to every device. */
    {
        size_t n = 2000001;
        cl_mem m = buffer(n);
        unsigned char *got = malloc(n);
        if (rank == 0) {
            unsigned char *mine = patterned(n, 0, 9);
            fill(m, mine, n);
            free(mine);
        }
        MPI(MPI_Bcast(m, (int)n, cl_byte, 0, MPI_COMM_WORLD));
        read_back(m, got, n);
        check_pattern(got, n, 0, 9, "Bcast");
        free(got);
        clReleaseMemObject(m);
    }

    /* Sums over every rank, in float and double, in place and not. */
    {
        int n = 100003;
        float *f = malloc(n * sizeof *f);
        double *d = malloc(n * sizeof *d);
        for (int i = 0; i < n; ++i) {
            f[i] = (float)(rank + 1) * (float)(i % 100);
            d[i] = (double)(rank + 1) * 0.5 * (double)i;
        }
        cl_mem fs = buffer(n * sizeof *f), fr = buffer(n * sizeof *f), dm = buffer(n * sizeof *d);
        fill(fs, f, n * sizeof *f);
        fill(dm, d, n * sizeof *d);
        MPI(MPI_Allreduce(fs, fr, n, cl_float, MPI_SUM, MPI_COMM_WORLD));
        MPI(MPI_Allreduce(MPI_IN_PLACE, dm, n, cl_double, MPI_SUM, MPI_COMM_WORLD));
        read_back(fr, f, n * sizeof *f);
        read_back(dm, d, n * sizeof *d);
        double factor = ranks * (ranks + 1) / 2.0;
        for (int i = 0; i < n; ++i) {
            if (f[i] != (float)(factor * (i % 100))) FAIL("Allreduce float [%d] = %g", i, f[i]);
            if (d[i] != factor * 0.5 * i) FAIL("Allreduce double [%d] = %g", i, d[i]);
        }
        free(f);
        free(d);
        clReleaseMemObject(fs);
        clReleaseMemObject(fr);
        clReleaseMemObject(dm);
    }

    MPI_Type_free(&cl_byte);
    MPI_Type_free(&cl_float);
    MPI_Type_free(&cl_double);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("PASS mpi_buffers rank %d\n", rank);
    MPI_Finalize();
    return 0;
}
