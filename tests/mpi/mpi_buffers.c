/* mpi_buffers: MPI calls on rgpu OpenCL buffers (marked by their datatype, rgpu_mpi.h), run
 * under mpirun with `rgpu run --mpi`. Each rank uses device (rank % devices) of the rgpu
 * platform. Checks, with every result read back from the device:
 *   device -> device, device -> host and host -> device MPI_Send/MPI_Recv of odd sizes;
 *   many concurrent MPI_Isend/MPI_Irecv, small and large, completed by MPI_Waitall,
 *   MPI_Waitany and MPI_Testall; MPI_Sendrecv around a ring; a large MPI_Irecv into host memory
 *   from a device buffer; MPI_Bcast; MPI_Allreduce (sum of float and double, in place and not);
 *   MPI_Reduce, MPI_Gather, MPI_Allgather, MPI_Scatter, MPI_Alltoall, MPI_Scan, MPI_Exscan,
 *   MPI_Reduce_scatter_block, the v-variants (Gatherv, Allgatherv, Scatterv, Alltoallv,
 *   Reduce_scatter) and MPI_Ssend; calls rgpu does not handle (MPI_Sendrecv_replace,
 *   MPI_Iallgather) refusing a device buffer with MPI_ERR_BUFFER.
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

    /* An exchange whose MPI_Waitall lists the direct send before the receive, on both ranks:
     * each rank's send waits for the other's word that it pulled, which comes only once that
     * rank has finished its receive. */
    if (paired) {
        size_t n = 300007;
        unsigned char *got = malloc(n), *mine = patterned(n, rank, 56);
        cl_mem out = buffer(n), in = buffer(n);
        fill(out, mine, n);
        MPI_Request r[2];
        MPI(MPI_Isend(out, (int)n, cl_byte, peer, 56, MPI_COMM_WORLD, &r[0]));
        MPI(MPI_Irecv(in, (int)n, cl_byte, peer, 56, MPI_COMM_WORLD, &r[1]));
        MPI(MPI_Waitall(2, r, MPI_STATUSES_IGNORE));
        read_back(in, got, n);
        check_pattern(got, n, peer, 56, "Waitall, the send listed first");
        free(got);
        free(mine);
        clReleaseMemObject(out);
        clReleaseMemObject(in);
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

    /* The other collectives, staged: every result read back from the devices. */
    {
        MPI_Datatype cl_int_type;
        MPI(rgpu_mpi_opencl_type(MPI_INT, queue, &cl_int_type));
        const int n = 1003; /* ints per rank */
        size_t all = (size_t)n * ranks;
        int *mine = malloc(all * sizeof *mine), *got = malloc(all * sizeof *got);
        for (size_t i = 0; i < all; ++i) mine[i] = rank * 100000 + (int)i;
        cl_mem send = buffer(all * sizeof *mine), recv = buffer(all * sizeof *got);
        fill(send, mine, all * sizeof *mine);

        /* Reduce to rank 0: the sum over ranks of rank * 100000 + i. */
        MPI(MPI_Reduce(send, recv, n, cl_int_type, MPI_SUM, 0, MPI_COMM_WORLD));
        if (rank == 0) {
            read_back(recv, got, n * sizeof *got);
            for (int i = 0; i < n; ++i) {
                int want = 100000 * ranks * (ranks - 1) / 2 + ranks * i;
                if (got[i] != want) FAIL("Reduce [%d] = %d, not %d", i, got[i], want);
            }
        }
        /* Gather to rank 0 and Allgather: rank r's first n ints at r * n. */
        MPI(MPI_Gather(send, n, cl_int_type, recv, n, cl_int_type, 0, MPI_COMM_WORLD));
        for (int round = 0; round < 2; ++round) {
            if (round == 1) MPI(MPI_Allgather(send, n, cl_int_type, recv, n, cl_int_type, MPI_COMM_WORLD));
            if (round == 0 && rank != 0) continue;
            read_back(recv, got, all * sizeof *got);
            for (int r = 0; r < ranks; ++r)
                for (int i = 0; i < n; ++i)
                    if (got[r * n + i] != r * 100000 + i)
                        FAIL("%s [%d][%d] = %d", round ? "Allgather" : "Gather", r, i, got[r * n + i]);
        }
        /* Scatter from rank 0: rank r gets rank 0's ints r * n ... */
        MPI(MPI_Scatter(send, n, cl_int_type, recv, n, cl_int_type, 0, MPI_COMM_WORLD));
        read_back(recv, got, n * sizeof *got);
        for (int i = 0; i < n; ++i)
            if (got[i] != rank * n + i) FAIL("Scatter [%d] = %d", i, got[i]);
        /* Alltoall: block b of rank r goes to rank b's block r. */
        MPI(MPI_Alltoall(send, n, cl_int_type, recv, n, cl_int_type, MPI_COMM_WORLD));
        read_back(recv, got, all * sizeof *got);
        for (int r = 0; r < ranks; ++r)
            for (int i = 0; i < n; ++i)
                if (got[r * n + i] != r * 100000 + rank * n + i) FAIL("Alltoall [%d][%d] = %d", r, i, got[r * n + i]);
        /* Scan and Exscan (sums over ranks up to this one), Reduce_scatter_block. */
        MPI(MPI_Scan(send, recv, n, cl_int_type, MPI_SUM, MPI_COMM_WORLD));
        read_back(recv, got, n * sizeof *got);
        for (int i = 0; i < n; ++i)
            if (got[i] != 100000 * rank * (rank + 1) / 2 + (rank + 1) * i) FAIL("Scan [%d] = %d", i, got[i]);
        MPI(MPI_Exscan(send, recv, n, cl_int_type, MPI_SUM, MPI_COMM_WORLD));
        read_back(recv, got, n * sizeof *got);
        for (int i = 0; rank > 0 && i < n; ++i)
            if (got[i] != 100000 * rank * (rank - 1) / 2 + rank * i) FAIL("Exscan [%d] = %d", i, got[i]);
        MPI(MPI_Reduce_scatter_block(send, recv, n, cl_int_type, MPI_SUM, MPI_COMM_WORLD));
        read_back(recv, got, n * sizeof *got);
        for (int i = 0; i < n; ++i) {
            int want = 100000 * ranks * (ranks - 1) / 2 + ranks * (rank * n + i);
            if (got[i] != want) FAIL("Reduce_scatter_block [%d] = %d, not %d", i, got[i], want);
        }
        /* The v-variants, with every rank's block n ints at r * n (the results of the plain
         * calls above). */
        {
            int *counts = malloc(ranks * sizeof *counts), *displs = malloc(ranks * sizeof *displs);
            for (int r = 0; r < ranks; ++r) counts[r] = n, displs[r] = r * n;
            MPI(MPI_Gatherv(send, n, cl_int_type, recv, counts, displs, cl_int_type, 0, MPI_COMM_WORLD));
            for (int round = 0; round < 2; ++round) {
                if (round == 1)
                    MPI(MPI_Allgatherv(send, n, cl_int_type, recv, counts, displs, cl_int_type, MPI_COMM_WORLD));
                if (round == 0 && rank != 0) continue;
                read_back(recv, got, all * sizeof *got);
                for (int r = 0; r < ranks; ++r)
                    for (int i = 0; i < n; ++i)
                        if (got[r * n + i] != r * 100000 + i)
                            FAIL("%s [%d][%d] = %d", round ? "Allgatherv" : "Gatherv", r, i, got[r * n + i]);
            }
            MPI(MPI_Scatterv(send, counts, displs, cl_int_type, recv, n, cl_int_type, 0, MPI_COMM_WORLD));
            read_back(recv, got, n * sizeof *got);
            for (int i = 0; i < n; ++i)
                if (got[i] != rank * n + i) FAIL("Scatterv [%d] = %d", i, got[i]);
            MPI(MPI_Alltoallv(send, counts, displs, cl_int_type, recv, counts, displs, cl_int_type, MPI_COMM_WORLD));
            read_back(recv, got, all * sizeof *got);
            for (int r = 0; r < ranks; ++r)
                for (int i = 0; i < n; ++i)
                    if (got[r * n + i] != r * 100000 + rank * n + i) FAIL("Alltoallv [%d][%d] = %d", r, i, got[r * n + i]);
            MPI(MPI_Reduce_scatter(send, recv, counts, cl_int_type, MPI_SUM, MPI_COMM_WORLD));
            read_back(recv, got, n * sizeof *got);
            for (int i = 0; i < n; ++i) {
                int want = 100000 * ranks * (ranks - 1) / 2 + ranks * (rank * n + i);
                if (got[i] != want) FAIL("Reduce_scatter [%d] = %d, not %d", i, got[i], want);
            }
            free(counts);
            free(displs);
        }
        /* Ssend around the ring (even ranks send first), 200000 bytes: direct. */
        {
            int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
            size_t bytes = 200000;
            unsigned char *out = patterned(bytes, rank, 31), *in = malloc(bytes);
            cl_mem a = buffer(bytes), b = buffer(bytes);
            fill(a, out, bytes);
            if (rank % 2 == 0) {
                MPI(MPI_Ssend(a, (int)bytes, cl_byte, next, 31, MPI_COMM_WORLD));
                MPI(MPI_Recv(b, (int)bytes, cl_byte, prev, 31, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            } else {
                MPI(MPI_Recv(b, (int)bytes, cl_byte, prev, 31, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
                MPI(MPI_Ssend(a, (int)bytes, cl_byte, next, 31, MPI_COMM_WORLD));
            }
            read_back(b, in, bytes);
            check_pattern(in, bytes, prev, 31, "Ssend");
            free(out);
            free(in);
            clReleaseMemObject(a);
            clReleaseMemObject(b);
        }
        /* A call rgpu does not handle refuses a device buffer with an MPI error. */
        {
            MPI_Comm returning;
            MPI(MPI_Comm_dup(MPI_COMM_WORLD, &returning));
            MPI(MPI_Comm_set_errhandler(returning, MPI_ERRORS_RETURN));
            int rc = MPI_Sendrecv_replace(send, n, cl_int_type, rank, 5, rank, 5, returning,
                                          MPI_STATUS_IGNORE);
            int class_ = MPI_SUCCESS;
            MPI_Error_class(rc, &class_);
            if (class_ != MPI_ERR_BUFFER) FAIL("Sendrecv_replace on a device buffer gave %d", rc);
            MPI_Request never;
            rc = MPI_Iallgather(send, n, cl_int_type, recv, n, cl_int_type, returning, &never);
            MPI_Error_class(rc, &class_);
            if (class_ != MPI_ERR_BUFFER) FAIL("Iallgather on a device buffer gave %d", rc);
            MPI(MPI_Comm_free(&returning));
        }
        free(mine);
        free(got);
        clReleaseMemObject(send);
        clReleaseMemObject(recv);
        MPI_Type_free(&cl_int_type);
    }

    MPI_Type_free(&cl_byte);
    MPI_Type_free(&cl_float);
    MPI_Type_free(&cl_double);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("PASS mpi_buffers rank %d\n", rank);
    MPI_Finalize();
    return 0;
}
