/* Two OpenCL loops the performance model (docs/model.md) is validated on:
 *
 *   model_loops PLATFORM_SUBSTRING copy ROUNDS BYTES    blocking write then blocking read of
 *                                                       BYTES, ROUNDS times (copy-bound)
 *   model_loops PLATFORM_SUBSTRING launch ROUNDS EVERY  ROUNDS launches of a small kernel,
 *                                                       clFinish after every EVERY (launch-bound)
 *
 * prints `RESULT <mode> seconds S` (the loop alone). */
#include "bench_common.h"

static const char *SOURCE =
    "__kernel void bump(__global int *v) { v[get_global_id(0)] += 1; }\n";

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: model_loops PLATFORM copy|launch ROUNDS BYTES|EVERY\n");
        return 2;
    }
    const char *want = argv[1], *mode = argv[2];
    long rounds = atol(argv[3]), arg = atol(argv[4]);
    cl_device_id dev = device_of_platform(want);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    double start = 0, end = 0;
    if (!strcmp(mode, "copy")) {
        size_t bytes = (size_t)arg;
        char *host = malloc(bytes);
        memset(host, 7, bytes);
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        CHECK(err);
        start = now();
        for (long r = 0; r < rounds; r++) {
            CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
        }
        end = now();
        CHECK(clReleaseMemObject(buf));
        free(host);
    } else if (!strcmp(mode, "launch")) {
        size_t items = 1024;
        cl_program p = clCreateProgramWithSource(ctx, 1, &SOURCE, NULL, &err);
        CHECK(err);
        CHECK(clBuildProgram(p, 1, &dev, NULL, NULL, NULL));
        cl_kernel k = clCreateKernel(p, "bump", &err);
        CHECK(err);
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, items * sizeof(int), NULL, &err);
        CHECK(err);
        int zero = 0;
        CHECK(clEnqueueFillBuffer(q, buf, &zero, sizeof zero, 0, items * sizeof(int), 0, NULL, NULL));
        CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
        CHECK(clFinish(q));
        start = now();
        for (long r = 0; r < rounds; r++) {
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &items, NULL, 0, NULL, NULL));
            if ((r + 1) % arg == 0) CHECK(clFinish(q));
        }
        CHECK(clFinish(q));
        end = now();
        int first = 0;
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof first, &first, 0, NULL, NULL));
        if (first != rounds) {
            fprintf(stderr, "bump: %d, expected %ld\n", first, rounds);
            return 1;
        }
        CHECK(clReleaseMemObject(buf));
        CHECK(clReleaseKernel(k));
        CHECK(clReleaseProgram(p));
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("RESULT %s seconds %.6f\n", mode, end - start);
    return 0;
}
