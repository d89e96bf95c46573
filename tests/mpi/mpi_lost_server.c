/* mpi_lost_server: an MPI_Send from an rgpu OpenCL buffer whose server is gone returns an MPI
 * error (MPI_ERRORS_RETURN) with a message, within seconds, instead of hanging. Rank 0 makes
 * its buffer, says READY and waits for the file named by RGPU_TEST_GO (the test kills rank 0's
 * server first), then sends. Rank 1 waits for the message for at most 20 s.
 * Prints `SEND_ERROR <code> after <s> s` or `SEND_OK` (rank 0); `RECV_TIMEOUT` or `RECV_DONE`
 * (rank 1).
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../mpi/rgpu_mpi.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    enum { N = 1 << 20 };
    if (rank == 0) {
        cl_platform_id platforms[8];
        cl_uint n = 0;
        clGetPlatformIDs(8, platforms, &n);
        cl_platform_id rgpu = NULL;
        for (cl_uint i = 0; i < n; ++i) {
            char name[64] = "";
            clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
            if (!strcmp(name, "rgpu")) rgpu = platforms[i];
        }
        cl_device_id device;
        cl_int e = rgpu ? clGetDeviceIDs(rgpu, CL_DEVICE_TYPE_ALL, 1, &device, NULL) : -1;
        if (e) {
            printf("FAIL: no rgpu device (%d)\n", e);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &e);
        cl_command_queue queue = clCreateCommandQueueWithProperties(context, device, NULL, &e);
        cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, N, NULL, &e);
        clFinish(queue);
        MPI_Datatype cl_byte;
        rgpu_mpi_opencl_type(MPI_BYTE, queue, &cl_byte);
        printf("READY\n");
        fflush(stdout);
        const char *go = getenv("RGPU_TEST_GO");
        while (go && access(go, F_OK) != 0) usleep(20000);
        double t0 = now();
        int rc = MPI_Send(m, N, cl_byte, 1, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            printf("SEND_ERROR %d after %.1f s\n", rc, now() - t0);
        else
            printf("SEND_OK\n");
        fflush(stdout);
        /* Release the receiver either way. */
        char one = 1;
        MPI_Send(&one, 1, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
    } else if (rank == 1) {
        static char host[N];
        MPI_Request requests[2];
        char one;
        MPI_Irecv(host, N, MPI_BYTE, 0, 0, MPI_COMM_WORLD, &requests[0]);
        MPI_Irecv(&one, 1, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &requests[1]);
        double t0 = now();
        int flag = 0;
        while (!flag && now() - t0 < 60) {
            MPI_Test(&requests[1], &flag, MPI_STATUS_IGNORE);
            usleep(10000);
        }
        printf(flag ? "RECV_DONE\n" : "RECV_TIMEOUT\n");
        fflush(stdout);
        MPI_Cancel(&requests[0]);
        MPI_Request_free(&requests[0]);
    }
    MPI_Finalize();
    return 0;
}
