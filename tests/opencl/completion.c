/* Completion of commands' events: once a clFinish or a clWaitForEvents has returned, every
 * command it implies is complete, and querying or waiting for those commands' events must say
 * CL_COMPLETE (through rgpu: without asking the server again; tests/test_completion.py reads
 * the call trace).
 *
 * 1. 32 kernels, each with an event; clFinish; each event queried 4 times; all waited for.
 * 2. 32 more kernels with events (in-order queue); clWaitForEvents on the last only; each
 *    event queried (the earlier ones complete too: the queue is in order).
 * 3. A long kernel's event polled until CL_COMPLETE, then its result checked. Prints
 *    "polls N" on stderr.
 * Prints "PASS completion". */
#include "common.h"

#define N 32

static const char *SRC =
    "__kernel void bump(__global uint *a) { a[get_global_id(0)] += 1; }\n"
    "__kernel void churn(__global uint *a, uint n) {\n"
    "  uint x = a[0]; for (uint i = 0; i < n; i++) x = x * 1664525u + 1013904223u;\n"
    "  a[1] = x; }\n";

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

    cl_kernel churn = CHKE(clCreateKernel(prog, "churn", E));
    cl_uint rounds = 100000000u;
    CHECK(clSetKernelArg(churn, 0, sizeof buf, &buf));
    CHECK(clSetKernelArg(churn, 1, sizeof rounds, &rounds));
    cl_event long_event;
    CHECK(clEnqueueTask(q, churn, 0, NULL, &long_event));
    CHECK(clFlush(q));
    long polls = 0;
    cl_int status;
    do {
        CHECK(clGetEventInfo(long_event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status,
                             &status, NULL));
        polls++;
    } while (status > CL_COMPLETE);
    if (status != CL_COMPLETE) {
        fprintf(stderr, "FAIL completion.c:%d: the long kernel ended with %d\n", __LINE__, status);
        return 1;
    }
    cl_uint x = 2 * N;
    for (cl_uint i = 0; i < rounds; i++) x = x * 1664525u + 1013904223u;
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, sizeof(cl_uint), sizeof x, &out[1], 0, NULL, NULL));
    if (out[1] != x) {
        fprintf(stderr, "FAIL completion.c:%d: the long kernel computed %u, expected %u\n",
                __LINE__, out[1], x);
        return 1;
    }
    fprintf(stderr, "polls %ld\n", polls);
    CHECK(clReleaseEvent(long_event));
    CHECK(clReleaseKernel(churn));
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
