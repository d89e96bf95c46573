/* Completion of commands' events: once a clFinish or a clWaitForEvents has returned, every
 * command it implies is complete, and querying or waiting for those commands' events must say
 * CL_COMPLETE (through rgpu: without asking the server again; tests/test_completion.py reads
 * the call trace).
 *
 * 1. 32 kernels, each with an event; clFinish; each event queried 4 times; all waited for.
 * 2. 32 more kernels with events (in-order queue); clWaitForEvents on the last only; each
 *    event queried (the earlier ones complete too: the queue is in order).
 * Prints "PASS completion". */
#include "common.h"

#define N 32

static const char *SRC = "__kernel void bump(__global uint *a) { a[get_global_id(0)] += 1; }\n";

static void expect_complete(cl_event e, int line) {
    cl_int status = -1;
    CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
    if (status != CL_COMPLETE) {
        fprintf(stderr, "FAIL completion.c:%d: status %d after the wait, not CL_COMPLETE\n", line,
                status);
        exit(1);
    }
}

int main(void) {
    select_device();
    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, 0);
    cl_program prog = build_program(ctx, SRC, "");
    cl_kernel k = CHKE(clCreateKernel(prog, "bump", E));
    size_t n = 1024;
    cl_mem buf = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(cl_uint), NULL, E));
    cl_uint zero = 0;
    CHECK(clEnqueueFillBuffer(q, buf, &zero, sizeof zero, 0, n * sizeof(cl_uint), 0, NULL, NULL));
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));

    cl_event first[N], second[N];
    for (int i = 0; i < N; i++)
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &first[i]));
    CHECK(clFinish(q));
    for (int round = 0; round < 4; round++)
        for (int i = 0; i < N; i++) expect_complete(first[i], __LINE__);
    CHECK(clWaitForEvents(N, first));

    for (int i = 0; i < N; i++)
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &second[i]));
    CHECK(clWaitForEvents(1, &second[N - 1]));
    for (int i = 0; i < N; i++) expect_complete(second[i], __LINE__);

    cl_uint out[4];
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    if (out[0] != 2 * N || out[3] != 2 * N) {
        fprintf(stderr, "FAIL completion.c:%d: %u and %u, expected %d\n", __LINE__, out[0], out[3],
                2 * N);
        return 1;
    }
    for (int i = 0; i < N; i++) {
        CHECK(clReleaseEvent(first[i]));
        CHECK(clReleaseEvent(second[i]));
    }
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    pass("completion");
    return 0;
}
