/* Live migration of a running program's session (docs/migration.md): buffers (one made from
 * host memory, one with a sub-buffer), a program and kernels with their arguments set, a
 * sampler, events with profiling, a program the program already released;
 * half the work runs, the session moves from server RGPU_TEST_MIGRATE_FROM to
 * RGPU_TEST_MIGRATE_TO through rgpu's `rgpu_opencl_migrate`, and the rest runs with the same
 * handles, a program made from a binary among them (RGPU_TEST_MIGRATE_BY=operator: the server's operator moves it with `rgpu migrate`
 * while the program waits for a line on stdin). Every result is checked against the same
 * arithmetic on the host. A first move,
 * tried while a user event is unset, must be refused with nothing moved. Prints
 * "PASS migrate". */
#include "common.h"

#include <pthread.h>

typedef cl_int (*MigrateFn)(const char *from, const char *to, char *why, size_t why_len);

static const char *SRC =
    "__kernel void scale(__global int *a, int k) {\n"
    "  size_t i = get_global_id(0); a[i] = a[i] * k + (int)i; }\n"
    "__kernel void add(__global const int *a, __global int *b) {\n"
    "  size_t i = get_global_id(0); b[i] = b[i] + a[i]; }\n";

enum { N = 1 << 18 }; /* 1 MiB of ints: more than one fabric chunk */

static void expect(const cl_int *got, const cl_int *want, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fprintf(stderr, "FAIL %s: [%d] = %d, not %d\n", what, i, got[i], want[i]);
            exit(1);
        }
    }
}

static void host_scale(cl_int *a, int k) {
    for (int i = 0; i < N; i++) a[i] = a[i] * k + i;
}

static void host_add(const cl_int *a, cl_int *b) {
    for (int i = 0; i < N; i++) b[i] += a[i];
}

/* Another thread of the program calls on while the move happens: its calls wait at the gate
 * and then go to the new server. */
static volatile int g_stop;
static cl_event g_watched;

static void *keep_calling(void *arg) {
    long *calls = arg;
    while (!g_stop) {
        cl_int status = -1;
        CHECK(clGetEventInfo(g_watched, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status,
                             &status, NULL));
        REQUIRE(status == CL_COMPLETE, "the other thread saw status %d", status);
        char name[256];
        CHECK(clGetDeviceInfo(g_device, CL_DEVICE_NAME, sizeof name, name, NULL));
        (*calls)++;
    }
    return NULL;
}

int main(void) {
    select_device();
    REQUIRE(g_remote, "the rgpu platform is needed (RGPU_TEST_PLATFORM=rgpu)");
    const char *from = getenv("RGPU_TEST_MIGRATE_FROM");
    const char *to = getenv("RGPU_TEST_MIGRATE_TO");
    REQUIRE(from && to, "RGPU_TEST_MIGRATE_FROM and RGPU_TEST_MIGRATE_TO name the servers");
    MigrateFn migrate =
        (MigrateFn)clGetExtensionFunctionAddressForPlatform(g_platform, "rgpu_opencl_migrate");
    REQUIRE(migrate, "the rgpu platform offers rgpu_opencl_migrate");

    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, CL_QUEUE_PROFILING_ENABLE);
    cl_program prog = build_program(ctx, SRC, "-DUNUSED=1");
    cl_kernel scale = CHKE(clCreateKernel(prog, "scale", E));
    cl_kernel add = CHKE(clCreateKernel(prog, "add", E));
    /* Released by the program, still used by its kernels: it must move. */
    CHECK(clReleaseProgram(prog));

    cl_int *ha = malloc(N * sizeof(cl_int)), *hb = malloc(N * sizeof(cl_int));
    cl_int *got = malloc(N * sizeof(cl_int));
    for (int i = 0; i < N; i++) {
        ha[i] = i % 1000 - 500;
        hb[i] = 7 * i;
    }
    cl_mem a = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                   N * sizeof(cl_int), ha, E));
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(cl_int), NULL, E));
    CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, N * sizeof(cl_int), hb, 0, NULL, NULL));
    cl_buffer_region half = {N / 2 * sizeof(cl_int), N / 2 * sizeof(cl_int)};
    cl_mem b_high =
        CHKE(clCreateSubBuffer(b, 0, CL_BUFFER_CREATE_TYPE_REGION, &half, E));
    cl_sampler sampler = NULL;
    if (device_uint(g_device, CL_DEVICE_IMAGE_SUPPORT)) {
        sampler = CHKE(clCreateSampler(ctx, CL_TRUE, CL_ADDRESS_CLAMP, CL_FILTER_LINEAR, E));
    }

    /* The first half of the work, left on the server (nothing read back). */
    size_t global = N;
    int k = 3;
    CHECK(clSetKernelArg(scale, 0, sizeof a, &a));
    CHECK(clSetKernelArg(scale, 1, sizeof k, &k));
    CHECK(clSetKernelArg(add, 0, sizeof a, &a));
    CHECK(clSetKernelArg(add, 1, sizeof b, &b));
    cl_event scaled, added;
    CHECK(clEnqueueNDRangeKernel(q, scale, 1, NULL, &global, NULL, 0, NULL, &scaled));
    CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &global, NULL, 1, &scaled, &added));
    host_scale(ha, k);
    host_add(ha, hb);

    /* A second context, an out-of-order queue, a buffer on the program's own memory. */
    cl_context ctx2 = make_context();
    cl_command_queue q2 = make_queue(ctx2, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
    cl_program prog2 = build_program(ctx2, SRC, "");
    cl_kernel scale2 = CHKE(clCreateKernel(prog2, "scale", E));
    cl_int *hu = malloc(N * sizeof(cl_int)), *want_u = malloc(N * sizeof(cl_int));
    for (int i = 0; i < N; i++) hu[i] = want_u[i] = 3 * i - 11;
    cl_mem u = CHKE(clCreateBuffer(ctx2, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                                   N * sizeof(cl_int), hu, E));
    int k2 = 5;
    CHECK(clSetKernelArg(scale2, 0, sizeof u, &u));
    CHECK(clSetKernelArg(scale2, 1, sizeof k2, &k2));
    CHECK(clEnqueueNDRangeKernel(q2, scale2, 1, NULL, &global, NULL, 0, NULL, NULL));
    host_scale(want_u, k2);

    /* A program made from another's binary (the move carries the binary, not a source). */
    size_t binary_size = 0;
    CHECK(clGetProgramInfo(prog2, CL_PROGRAM_BINARY_SIZES, sizeof binary_size, &binary_size,
                           NULL));
    unsigned char *binary = malloc(binary_size);
    CHECK(clGetProgramInfo(prog2, CL_PROGRAM_BINARIES, sizeof binary, &binary, NULL));
    const unsigned char *binaries[1] = {binary};
    cl_program prog3 =
        CHKE(clCreateProgramWithBinary(ctx2, 1, &g_device, &binary_size, binaries, NULL, E));
    CHECK(clBuildProgram(prog3, 1, &g_device, "", NULL, NULL));
    cl_kernel add3 = CHKE(clCreateKernel(prog3, "add", E));
    cl_mem w = CHKE(clCreateBuffer(ctx2, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                   N * sizeof(cl_int), want_u, E));
    cl_int *want_w = malloc(N * sizeof(cl_int));
    memcpy(want_w, want_u, N * sizeof(cl_int));
    CHECK(clSetKernelArg(add3, 0, sizeof u, &u));
    CHECK(clSetKernelArg(add3, 1, sizeof w, &w));
    CHECK(clEnqueueNDRangeKernel(q2, add3, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clFinish(q2));
    host_add(want_u, want_w);

    /* Refused while a user event is unset (commands may wait on it): nothing moves. */
    cl_event gate = CHKE(clCreateUserEvent(ctx, E));
    char why[512] = "";
    cl_int refused = migrate(from, to, why, sizeof why);
    REQUIRE(refused != CL_SUCCESS, "a move with an unset user event was not refused");
    REQUIRE(strstr(why, "user event") != NULL, "the refusal says why: %s", why);
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));

    /* Refused with an image (its contents do not travel yet): nothing moves. */
    if (sampler) {
        cl_image_format format = {CL_RGBA, CL_UNORM_INT8};
        cl_image_desc desc = {0};
        desc.image_type = CL_MEM_OBJECT_IMAGE2D;
        desc.image_width = desc.image_height = 16;
        cl_mem image = CHKE(clCreateImage(ctx2, CL_MEM_READ_ONLY, &format, &desc, NULL, E));
        why[0] = 0;
        REQUIRE(migrate(from, to, why, sizeof why) != CL_SUCCESS, "a move with an image");
        REQUIRE(strstr(why, "images") != NULL, "the refusal says why: %s", why);
        CHECK(clReleaseMemObject(image));
    }

    /* The move, between two commands of the program, another thread calling meanwhile. */
    CHECK(clFinish(q)); /* the other thread checks `added` is complete */
    g_watched = added;
    long calls = 0;
    pthread_t other;
    REQUIRE(pthread_create(&other, NULL, keep_calling, &calls) == 0, "pthread_create");
    while (calls < 10) usleep(1000);
    why[0] = 0;
    double t0 = now_s();
    cl_int moved = CL_SUCCESS;
    const char *by = getenv("RGPU_TEST_MIGRATE_BY");
    if (by && strcmp(by, "operator") == 0) {
        /* The server's operator moves the session (`rgpu migrate`) while this thread waits
         * here and the other keeps calling; the test says when it has. */
        printf("READY\n");
        fflush(stdout);
        char line[64];
        REQUIRE(fgets(line, sizeof line, stdin) != NULL, "no word from the test");
    } else {
        moved = migrate(from, to, why, sizeof why);
    }
    double pause = now_s() - t0;
    REQUIRE(moved == CL_SUCCESS, "the move failed (%s): %s", cl_err_name(moved), why);
    long at_move = calls;
    while (calls < at_move + 10) usleep(1000);
    g_stop = 1;
    pthread_join(other, NULL);
    printf("moved from %s to %s %s %.3f s (the other thread made %ld calls)\n", from, to,
           by ? "after waiting" : "in", pause, calls);

    /* Events of before the move: final, with their times. */
    cl_int status = -1;
    CHECK(clGetEventInfo(added, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
    REQUIRE(status == CL_COMPLETE, "the event of a command before the move is %d", status);
    cl_ulong start = 0, end = 0;
    CHECK(clGetEventProfilingInfo(scaled, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL));
    CHECK(clGetEventProfilingInfo(scaled, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL));
    REQUIRE(end >= start && start > 0, "profiling times %llu..%llu", (unsigned long long)start,
            (unsigned long long)end);

    /* The second half, with the same handles: arguments set before the move still hold, an
     * event of before the move in a wait list, a user event of before the move too. */
    cl_event wait[2] = {added, gate};
    cl_event scaled2;
    CHECK(clEnqueueNDRangeKernel(q, scale, 1, NULL, &global, NULL, 2, wait, &scaled2));
    CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &global, NULL, 1, &scaled2, NULL));
    host_scale(ha, k);
    host_add(ha, hb);
    CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, N * sizeof(cl_int), got, 0, NULL, NULL));
    expect(got, ha, N, "a after the move");
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N * sizeof(cl_int), got, 0, NULL, NULL));
    expect(got, hb, N, "b after the move");
    CHECK(clEnqueueReadBuffer(q, b_high, CL_TRUE, 0, N / 2 * sizeof(cl_int), got, 0, NULL, NULL));
    expect(got, hb + N / 2, N / 2, "b's sub-buffer after the move");

    /* The second context's buffer, on the program's memory, as the kernel left it. */
    CHECK(clEnqueueNDRangeKernel(q2, scale2, 1, NULL, &global, NULL, 0, NULL, NULL));
    host_scale(want_u, k2);
    CHECK(clFinish(q2));
    cl_int *mapped = CHKE(clEnqueueMapBuffer(q2, u, CL_TRUE, CL_MAP_READ, 0, N * sizeof(cl_int),
                                             0, NULL, NULL, E));
    expect(mapped, want_u, N, "the second context's buffer after the move");
    CHECK(clEnqueueUnmapMemObject(q2, u, mapped, 0, NULL, NULL));
    CHECK(clEnqueueNDRangeKernel(q2, add3, 1, NULL, &global, NULL, 0, NULL, NULL));
    host_add(want_u, want_w);
    CHECK(clFinish(q2)); /* an out-of-order queue: the read must not pass the kernel */
    CHECK(clEnqueueReadBuffer(q2, w, CL_TRUE, 0, N * sizeof(cl_int), got, 0, NULL, NULL));
    expect(got, want_w, N, "a buffer of a program made from a binary, after the move");
    CHECK(clFinish(q2));

    /* New objects after the move. */
    cl_mem c = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(cl_int), NULL, E));
    CHECK(clEnqueueCopyBuffer(q, b, c, 0, 0, N * sizeof(cl_int), 0, NULL, NULL));
    CHECK(clSetKernelArg(add, 0, sizeof b, &b));
    CHECK(clSetKernelArg(add, 1, sizeof c, &c));
    CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, c, CL_TRUE, 0, N * sizeof(cl_int), got, 0, NULL, NULL));
    for (int i = 0; i < N; i++) hb[i] *= 2;
    expect(got, hb, N, "a buffer made after the move");

    CHECK(clFinish(q));
    if (sampler) CHECK(clReleaseSampler(sampler));
    CHECK(clReleaseMemObject(c));
    CHECK(clReleaseMemObject(b_high));
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseMemObject(a));
    CHECK(clReleaseEvent(scaled2));
    CHECK(clReleaseEvent(gate));
    CHECK(clReleaseEvent(added));
    CHECK(clReleaseEvent(scaled));
    CHECK(clReleaseKernel(add));
    CHECK(clReleaseKernel(scale));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    CHECK(clReleaseMemObject(u));
    CHECK(clReleaseMemObject(w));
    CHECK(clReleaseKernel(add3));
    CHECK(clReleaseProgram(prog3));
    free(binary);
    free(want_w);
    CHECK(clReleaseKernel(scale2));
    CHECK(clReleaseProgram(prog2));
    CHECK(clReleaseCommandQueue(q2));
    CHECK(clReleaseContext(ctx2));
    free(hu);
    free(want_u);
    free(ha);
    free(hb);
    free(got);
    printf("PASS migrate\n");
    return 0;
}
