/* One context over devices of two servers (VirtualCL's single view of a cluster): kernels on
 * each server pass buffers between them, a queue of one server waits on an event of the
 * other, buffers are copied, migrated, read and partly written across servers; every result
 * is checked against the same arithmetic on the host. Needs the rgpu platform with devices of
 * at least two servers (RGPU_SERVERS); prints "PASS spanning". */
#include "common.h"

static const char *SRC =
    "__kernel void scale(__global int *a, int k) {\n"
    "  size_t i = get_global_id(0); a[i] = a[i] * k + (int)i; }\n"
    "__kernel void add(__global const int *a, __global int *b) {\n"
    "  size_t i = get_global_id(0); b[i] = b[i] + a[i]; }\n";

enum { N = 1 << 18 }; /* 1 MiB of ints: pulled in more than one fabric chunk */

static void expect_n(const cl_int *got, const cl_int *want, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fprintf(stderr, "FAIL %s: [%d] = %d, not %d\n", what, i, got[i], want[i]);
            exit(1);
        }
    }
}

static void expect(const cl_int *got, const cl_int *want, const char *what) {
    expect_n(got, want, N, what);
}

int main(void) {
    select_device();
    REQUIRE(g_remote, "the rgpu platform is needed (RGPU_TEST_PLATFORM=rgpu)");
    cl_uint n = 0;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n));
    cl_device_id *all = calloc(n, sizeof *all);
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, n, all, NULL));
    /* The first device, and the first of another server. */
    cl_device_id dev[2] = {all[0], NULL};
    char *first_server = device_str(all[0], CL_DEVICE_RGPU_SERVER);
    for (cl_uint i = 1; i < n && !dev[1]; i++) {
        char *server = device_str(all[i], CL_DEVICE_RGPU_SERVER);
        if (strcmp(server, first_server) != 0) dev[1] = all[i];
        free(server);
    }
    REQUIRE(dev[1], "devices of two servers are needed; all are on %s", first_server);

    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)g_platform, 0};
    cl_context ctx = CHKE(clCreateContext(props, 2, dev, ctx_notify, NULL, E));
    cl_uint count = 0;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof count, &count, NULL));
    REQUIRE(count == 2, "the context has %u devices", count);
    cl_command_queue q[2];
    for (int i = 0; i < 2; i++) q[i] = CHKE(clCreateCommandQueue(ctx, dev[i], 0, E));

    cl_program prog = CHKE(clCreateProgramWithSource(ctx, 1, &SRC, NULL, E));
    CHECK(clBuildProgram(prog, 0, NULL, "", NULL, NULL));
    for (int i = 0; i < 2; i++) {
        cl_build_status status = CL_BUILD_NONE;
        CHECK(clGetProgramBuildInfo(prog, dev[i], CL_PROGRAM_BUILD_STATUS, sizeof status,
                                    &status, NULL));
        REQUIRE(status == CL_BUILD_SUCCESS, "device %d: build status %d", i, status);
    }
    cl_kernel scale = CHKE(clCreateKernel(prog, "scale", E));
    cl_kernel add = CHKE(clCreateKernel(prog, "add", E));
    size_t wg = 0;
    CHECK(clGetKernelWorkGroupInfo(add, dev[1], CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL));
    REQUIRE(wg > 0, "no work-group size on the second server's device");

    cl_int *host_a = malloc(N * sizeof(cl_int)), *host_b = malloc(N * sizeof(cl_int));
    cl_int *want_a = malloc(N * sizeof(cl_int)), *want_b = malloc(N * sizeof(cl_int));
    cl_int *got = malloc(N * sizeof(cl_int));
    for (int i = 0; i < N; i++) {
        host_a[i] = i % 1000 - 300;
        host_b[i] = 7 * i;
    }
    size_t bytes = N * sizeof(cl_int), global = N;
    cl_mem a = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, bytes, host_a, E));
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, E));
    cl_mem c = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, E));

    /* b written on the second server; a scaled on the first; then a added into b on the
     * second, after the first's kernel (an event of the other server), a moving there. */
    CHECK(clEnqueueWriteBuffer(q[1], b, CL_TRUE, 0, bytes, host_b, 0, NULL, NULL));
    cl_int k = 3;
    cl_event scaled, added;
    CHECK(clSetKernelArg(scale, 0, sizeof a, &a));
    CHECK(clSetKernelArg(scale, 1, sizeof k, &k));
    CHECK(clEnqueueNDRangeKernel(q[0], scale, 1, NULL, &global, NULL, 0, NULL, &scaled));
    CHECK(clFlush(q[0]));
    CHECK(clSetKernelArg(add, 0, sizeof a, &a));
    CHECK(clSetKernelArg(add, 1, sizeof b, &b));
    CHECK(clEnqueueNDRangeKernel(q[1], add, 1, NULL, &global, NULL, 1, &scaled, &added));
    for (int i = 0; i < N; i++) {
        want_a[i] = host_a[i] * k + i;
        want_b[i] = host_b[i] + want_a[i];
    }
    /* b read on the first server: it moves back. */
    CHECK(clEnqueueReadBuffer(q[0], b, CL_TRUE, 0, bytes, got, 1, &added, NULL));
    expect(got, want_b, "a kernel's result read on the other server");
    CHECK(clEnqueueReadBuffer(q[1], a, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
    expect(got, want_a, "a buffer moved to the second server");

    /* A copy on the second server from a buffer last written on the first. */
    CHECK(clSetKernelArg(scale, 0, sizeof b, &b));
    CHECK(clEnqueueNDRangeKernel(q[0], scale, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clFinish(q[0]));
    for (int i = 0; i < N; i++) want_b[i] = want_b[i] * k + i;
    CHECK(clEnqueueCopyBuffer(q[1], b, c, 0, 0, bytes, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q[1], c, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
    expect(got, want_b, "a copy between buffers made on different servers");

    /* Part of c rewritten on the second server, then the whole of c used on the first. */
    cl_int patch[1000];
    for (int i = 0; i < 1000; i++) patch[i] = -i;
    CHECK(clEnqueueWriteBuffer(q[1], c, CL_TRUE, 4000 * sizeof(cl_int), sizeof patch, patch, 0,
                               NULL, NULL));
    for (int i = 0; i < 1000; i++) want_b[4000 + i] = -i;
    CHECK(clSetKernelArg(scale, 0, sizeof c, &c));
    CHECK(clEnqueueNDRangeKernel(q[0], scale, 1, NULL, &global, NULL, 0, NULL, NULL));
    for (int i = 0; i < N; i++) want_b[i] = want_b[i] * k + i;
    CHECK(clEnqueueReadBuffer(q[0], c, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
    expect(got, want_b, "a partly rewritten buffer used on the other server");

    /* clEnqueueMigrateMemObjects moves c to the second server ahead of its use there. */
    cl_event migrated;
    CHECK(clEnqueueMigrateMemObjects(q[1], 1, &c, 0, 0, NULL, &migrated));
    CHECK(clWaitForEvents(1, &migrated));
    CHECK(clEnqueueReadBuffer(q[1], c, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
    expect(got, want_b, "a migrated buffer");

    /* A sub-buffer (on the first server) of a buffer last written on the second: its
     * parent's contents come to the first server before it is read. */
    CHECK(clSetKernelArg(scale, 0, sizeof c, &c));
    CHECK(clEnqueueNDRangeKernel(q[1], scale, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clFinish(q[1]));
    for (int i = 0; i < N; i++) want_b[i] = want_b[i] * k + i;
    cl_buffer_region region = {0, 4096 * sizeof(cl_int)};
    cl_mem part = CHKE(clCreateSubBuffer(c, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, E));
    CHECK(clEnqueueReadBuffer(q[0], part, CL_TRUE, 0, region.size, got, 0, NULL, NULL));
    expect_n(got, want_b, 4096, "a sub-buffer");
    clReleaseMemObject(part);

    /* A kernel on the second server held by a user event of the first (the context's user
     * events live there) until the program sets it: resolved between the servers. */
    cl_event gate = CHKE(clCreateUserEvent(ctx, E));
    cl_event held;
    CHECK(clSetKernelArg(scale, 0, sizeof c, &c));
    CHECK(clEnqueueNDRangeKernel(q[1], scale, 1, NULL, &global, NULL, 1, &gate, &held));
    CHECK(clFlush(q[1]));
    usleep(300 * 1000);
    cl_int held_status = CL_QUEUED;
    CHECK(clGetEventInfo(held, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof held_status,
                         &held_status, NULL));
    REQUIRE(held_status > CL_COMPLETE, "a kernel ran before the event it waits on (%d)",
            held_status);
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &held));
    for (int i = 0; i < N; i++) want_b[i] = want_b[i] * k + i;
    CHECK(clEnqueueReadBuffer(q[0], c, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
    expect(got, want_b, "a kernel held by another server's user event");
    clReleaseEvent(gate);
    clReleaseEvent(held);

    clReleaseEvent(scaled);
    clReleaseEvent(added);
    clReleaseEvent(migrated);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(c);
    clReleaseKernel(scale);
    clReleaseKernel(add);
    clReleaseProgram(prog);
    for (int i = 0; i < 2; i++) clReleaseCommandQueue(q[i]);
    clReleaseContext(ctx);
    free(all);
    free(first_server);
    free(host_a);
    free(host_b);
    free(want_a);
    free(want_b);
    free(got);
    printf("PASS spanning\n");
    return 0;
}
