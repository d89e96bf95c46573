/* Helper for the isolation tests (not an API group): what one client could do to others.
 *   isolation crash              runs a kernel that writes to address 0x10, which crashes the
 *                                process running it on a CPU device (PoCL); prints
 *                                "RETURNED <code>" when the call that waits for it comes back
 *   isolation badoptions         builds with the options "-D" (no macro name; crashes PoCL's
 *                                compiler when it gets there): prints "RETURNED <code>"
 *   isolation secret TEXT        keeps TEXT in a buffer, prints "ADDRESS <hex>" (the buffer's
 *                                address in the server, as a kernel sees it) and "READY", then
 *                                waits for a line on stdin, runs a kernel over its own buffer
 *                                and checks TEXT is intact: "OK"
 *   isolation peek ADDRESS LEN   runs a kernel that reads LEN bytes at ADDRESS (another
 *                                session's buffer, on a CPU device) and prints "PEEKED <bytes>"
 *   isolation allocate BYTES N   creates N buffers of BYTES each, writing each once: prints
 *                                "ALLOCATED <i>" for each, or "REFUSED <i> <code>" at the first
 *                                refusal (quotas), then "FREED" after releasing them
 *   isolation recover            makes a buffer, prints "READY" and waits for a line on stdin
 *                                (meanwhile the test restarts the server); then reads the old
 *                                buffer ("OLD <code>": a device-lost error) and makes a new
 *                                context on the same device, whose buffer round-trips: "NEW OK"
 * Exit status 0 unless a check fails. */
#include "common.h"

static const char *ADDRESS_SRC =
    "__kernel void address(__global const uchar *buf, __global ulong *out) {\n"
    "    out[0] = (ulong)buf;\n"
    "}\n"
    "__kernel void touch(__global uchar *buf) {\n"
    "    buf[get_global_id(0)] ^= 0;\n"
    "}\n"
    "__kernel void scribble(__global int *unused) {\n"
    "    *(__global volatile int *)(ulong)0x10 = 1;\n"
    "}\n"
    "__kernel void peek(ulong address, __global uchar *out, uint len) {\n"
    "    __global const uchar *p = (__global const uchar *)address;\n"
    "    for (uint i = 0; i < len; i++) out[i] = p[i];\n"
    "}\n";

static cl_program build(cl_context ctx, const char *options, cl_int *status) {
    cl_program p = CHKE(clCreateProgramWithSource(ctx, 1, &ADDRESS_SRC, NULL, E));
    *status = clBuildProgram(p, 1, &g_device, options, NULL, NULL);
    return p;
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2, "usage: isolation crash|secret TEXT|peek ADDRESS LEN");
    select_device();
    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, 0);
    cl_int status;

    if (!strcmp(argv[1], "badoptions")) {
        build(ctx, "-D", &status);
        printf("RETURNED %d (%s)\n", (int)status, cl_err_name(status));
        return 0;
    }
    if (!strcmp(argv[1], "crash")) {
        cl_program p = build(ctx, NULL, &status);
        CHECK(status);
        cl_kernel k = CHKE(clCreateKernel(p, "scribble", E));
        cl_mem unused = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4, NULL, E));
        CHECK(clSetKernelArg(k, 0, sizeof unused, &unused));
        size_t one = 1;
        printf("LAUNCHING\n");
        fflush(stdout);
        status = clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL);
        if (status == CL_SUCCESS) status = clFinish(q);
        printf("RETURNED %d (%s)\n", (int)status, cl_err_name(status));
        return 0;
    }

    if (!strcmp(argv[1], "recover")) {
        cl_mem old = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, E));
        printf("READY\n");
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 1;
        char byte;
        cl_int err = clEnqueueReadBuffer(q, old, CL_TRUE, 0, 1, &byte, 0, NULL, NULL);
        printf("OLD %d (%s)\n", (int)err, cl_err_name(err));
        fflush(stdout);
        REQUIRE(err != CL_SUCCESS, "the old session still answers");
        cl_context fresh = make_context();
        cl_command_queue fq = make_queue(fresh, 0);
        cl_mem buf = CHKE(clCreateBuffer(fresh, CL_MEM_READ_WRITE, 16, NULL, E));
        const char text[16] = "back again";
        char back[16] = {0};
        CHECK(clEnqueueWriteBuffer(fq, buf, CL_TRUE, 0, 16, text, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(fq, buf, CL_TRUE, 0, 16, back, 0, NULL, NULL));
        REQUIRE(!memcmp(back, text, 16), "new session's buffer differs");
        printf("NEW OK\n");
        return 0;
    }
    if (!strcmp(argv[1], "allocate")) {
        REQUIRE(argc >= 4, "allocate BYTES N");
        size_t bytes = (size_t)strtoull(argv[2], NULL, 10);
        int n = atoi(argv[3]);
        cl_mem *bufs = calloc((size_t)n, sizeof *bufs);
        int made = 0;
        for (; made < n; made++) {
            cl_int err;
            bufs[made] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
            if (err == CL_SUCCESS) {
                unsigned char one = 1;
                err = clEnqueueWriteBuffer(q, bufs[made], CL_TRUE, bytes - 1, 1, &one, 0, NULL,
                                           NULL);
            }
            if (err != CL_SUCCESS) {
                printf("REFUSED %d %d (%s)\n", made, (int)err, cl_err_name(err));
                break;
            }
            printf("ALLOCATED %d\n", made);
        }
        fflush(stdout);
        for (int i = 0; i < made; i++) CHECK(clReleaseMemObject(bufs[i]));
        printf("FREED\n");
        return 0;
    }

    cl_program p = build(ctx, NULL, &status);
    CHECK(status);
    if (!strcmp(argv[1], "secret")) {
        REQUIRE(argc >= 3, "secret TEXT");
        size_t len = strlen(argv[2]) + 1;
        cl_mem buf = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, len, NULL, E));
        cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof(cl_ulong), NULL, E));
        CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, len, argv[2], 0, NULL, NULL));
        cl_kernel k = CHKE(clCreateKernel(p, "address", E));
        CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
        CHECK(clSetKernelArg(k, 1, sizeof out, &out));
        size_t one = 1;
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
        cl_ulong address = 0;
        CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof address, &address, 0, NULL, NULL));
        printf("ADDRESS %llx\nREADY\n", (unsigned long long)address);
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 1;
        cl_kernel touch = CHKE(clCreateKernel(p, "touch", E));
        CHECK(clSetKernelArg(touch, 0, sizeof buf, &buf));
        CHECK(clEnqueueNDRangeKernel(q, touch, 1, NULL, &len, NULL, 0, NULL, NULL));
        char *back = calloc(len, 1);
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, len, back, 0, NULL, NULL));
        REQUIRE(!memcmp(back, argv[2], len), "the secret changed: %s", back);
        printf("OK\n");
        return 0;
    }
    if (!strcmp(argv[1], "peek")) {
        REQUIRE(argc >= 4, "peek ADDRESS LEN");
        cl_ulong address = strtoull(argv[2], NULL, 16);
        cl_uint len = (cl_uint)atoi(argv[3]);
        cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, len + 1, NULL, E));
        cl_kernel k = CHKE(clCreateKernel(p, "peek", E));
        CHECK(clSetKernelArg(k, 0, sizeof address, &address));
        CHECK(clSetKernelArg(k, 1, sizeof out, &out));
        CHECK(clSetKernelArg(k, 2, sizeof len, &len));
        size_t one = 1;
        char *got = calloc(len + 1, 1);
        cl_int err = clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL);
        if (err == CL_SUCCESS) err = clEnqueueReadBuffer(q, out, CL_TRUE, 0, len, got, 0, NULL, NULL);
        printf("PEEKED %d %s\n", (int)err, got);
        return 0;
    }
    REQUIRE(0, "unknown mode %s", argv[1]);
    return 1;
}
