/*
 * vector_add.c: an ordinary OpenCL program (nothing rgpu-specific in it).
 *
 * SAXPY over 16 Mi floats (64 MiB per buffer), then a kernel-heavy loop: ITERS launches of a
 * kernel that does INNER multiply-adds per element, then reads the result back and checks every
 * element against the closed form of that arithmetic, computed on the host.
 *
 * Platform: the first whose name contains $EXAMPLE_PLATFORM (case-insensitive), else the first.
 * Device:   the first device of that platform.
 * Size:     $EXAMPLE_N elements (default 16777216).
 *
 * Prints the platform/device used, a per-phase time breakdown, "result: OK|FAIL ..." and
 * "elapsed_ms: X" (from context creation to the last byte read back). Exit 0 iff OK.
 *
 * Build: gcc -O2 -o vector_add examples/vector_add.c -lOpenCL
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITERS 4   /* launches of the heavy kernel */
#define INNER 64  /* multiply-adds per element per launch */

static const char *SOURCE =
    "__kernel void saxpy(float a, __global const float *x, __global float *y) {\n"
    "    size_t i = get_global_id(0);\n"
    "    y[i] = a * x[i] + y[i];\n"
    "}\n"
    "__kernel void heavy(__global const float *x, __global float *y, int inner) {\n"
    "    size_t i = get_global_id(0);\n"
    "    float v = y[i];\n"
    "    float xi = x[i];\n"
    "    for (int k = 0; k < inner; ++k)\n"
    "        v = v * 0.999f + xi * 0.001f;\n"
    "    y[i] = v;\n"
    "}\n";

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define CHECK(call)                                                                     \
    do {                                                                                \
        cl_int err_ = (call);                                                           \
        if (err_ != CL_SUCCESS) {                                                       \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, err_); \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK_ERR(err, what)                                                            \
    do {                                                                                \
        if ((err) != CL_SUCCESS) {                                                      \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, what, err);   \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

static int contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; ++hay) {
        size_t k = 0;
        while (k < n && hay[k] && tolower((unsigned char)hay[k]) == tolower((unsigned char)needle[k]))
            ++k;
        if (k == n) return 1;
    }
    return n == 0;
}

int main(void) {
    size_t n = 16u << 20;
    const char *env_n = getenv("EXAMPLE_N");
    if (env_n && atol(env_n) > 0) n = (size_t)atol(env_n);
    const char *want = getenv("EXAMPLE_PLATFORM");

    cl_uint nplat = 0;
    CHECK(clGetPlatformIDs(0, NULL, &nplat));
    if (nplat == 0) {
        fprintf(stderr, "no OpenCL platform\n");
        return 2;
    }
    cl_platform_id *plats = calloc(nplat, sizeof *plats);
    CHECK(clGetPlatformIDs(nplat, plats, NULL));
    cl_platform_id plat = NULL;
    char pname[256] = "";
    for (cl_uint i = 0; i < nplat; ++i) {
        char name[256] = "";
        CHECK(clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL));
        if (!want || !*want || contains_ci(name, want)) {
            plat = plats[i];
            strcpy(pname, name);
            break;
        }
    }
    if (!plat) {
        fprintf(stderr, "no OpenCL platform matches EXAMPLE_PLATFORM=%s\n", want);
        return 2;
    }
    cl_device_id dev;
    CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    char dname[256] = "";
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL));
    printf("platform: %s\ndevice:   %s\nelements: %zu (%.0f MiB per buffer)\n", pname, dname, n,
           n * sizeof(float) / 1048576.0);

    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    if (!x || !y || !out) {
        fprintf(stderr, "out of host memory\n");
        return 2;
    }
    for (size_t i = 0; i < n; ++i) {
        x[i] = (float)(i % 1000) * 0.001f;
        y[i] = (float)(i % 77) * 0.5f;
    }
    const float a = 2.5f;

    double t0 = now_ms();
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK_ERR(err, "clCreateContext");
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SOURCE, NULL, &err);
    CHECK_ERR(err, "clCreateProgramWithSource");
    err = clBuildProgram(prog, 1, &dev, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        char buildlog[8192] = "";
        clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof buildlog, buildlog, NULL);
        fprintf(stderr, "build failed (%d):\n%s\n", err, buildlog);
        return 2;
    }
    cl_kernel k_saxpy = clCreateKernel(prog, "saxpy", &err);
    CHECK_ERR(err, "clCreateKernel(saxpy)");
    cl_kernel k_heavy = clCreateKernel(prog, "heavy", &err);
    CHECK_ERR(err, "clCreateKernel(heavy)");
    cl_mem bx = clCreateBuffer(ctx, CL_MEM_READ_ONLY, n * sizeof(float), NULL, &err);
    CHECK_ERR(err, "clCreateBuffer(x)");
    cl_mem by = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
    CHECK_ERR(err, "clCreateBuffer(y)");
    double t_setup = now_ms();

    CHECK(clEnqueueWriteBuffer(q, bx, CL_FALSE, 0, n * sizeof(float), x, 0, NULL, NULL));
    CHECK(clEnqueueWriteBuffer(q, by, CL_FALSE, 0, n * sizeof(float), y, 0, NULL, NULL));
    CHECK(clFinish(q));
    double t_write = now_ms();

    CHECK(clSetKernelArg(k_saxpy, 0, sizeof a, &a));
    CHECK(clSetKernelArg(k_saxpy, 1, sizeof bx, &bx));
    CHECK(clSetKernelArg(k_saxpy, 2, sizeof by, &by));
    CHECK(clEnqueueNDRangeKernel(q, k_saxpy, 1, NULL, &n, NULL, 0, NULL, NULL));
    cl_int inner = INNER;
    CHECK(clSetKernelArg(k_heavy, 0, sizeof bx, &bx));
    CHECK(clSetKernelArg(k_heavy, 1, sizeof by, &by));
    CHECK(clSetKernelArg(k_heavy, 2, sizeof inner, &inner));
    for (int it = 0; it < ITERS; ++it)
        CHECK(clEnqueueNDRangeKernel(q, k_heavy, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    double t_kern = now_ms();

    CHECK(clEnqueueReadBuffer(q, by, CL_TRUE, 0, n * sizeof(float), out, 0, NULL, NULL));
    double t_read = now_ms();

    /* Check every element. The heavy loop v <- 0.999 v + 0.001 x converges to x geometrically,
     * so after K = ITERS * INNER steps v = x + (v0 - x) * 0.999^K (exact arithmetic; the float
     * iteration stays within ~K ulps of it). */
    const double decay = pow(0.999, (double)ITERS * INNER);
    size_t bad = 0;
    double max_err = 0;
    for (size_t i = 0; i < n; ++i) {
        double v0 = (double)(a * x[i] + y[i]);
        double v = x[i] + (v0 - x[i]) * decay;
        double e = fabs((double)out[i] - v) / (fabs(v) > 1.0 ? fabs(v) : 1.0);
        if (e > max_err) max_err = e;
        if (!(e <= 1e-4)) {
            if (bad < 5)
                fprintf(stderr, "mismatch at %zu: got %.7g, expected %.7g\n", i, out[i], v);
            ++bad;
        }
    }

    printf("setup (context, build, buffers): %9.1f ms\n", t_setup - t0);
    printf("write 2 x %4.0f MiB:              %9.1f ms (%.0f MiB/s)\n", n * 4 / 1048576.0,
           t_write - t_setup, 2 * n * 4 / 1048576.0 / ((t_write - t_setup) / 1e3));
    printf("kernels (1 saxpy + %d heavy):     %9.1f ms\n", ITERS, t_kern - t_write);
    printf("read 1 x %4.0f MiB:               %9.1f ms (%.0f MiB/s)\n", n * 4 / 1048576.0,
           t_read - t_kern, n * 4 / 1048576.0 / ((t_read - t_kern) / 1e3));
    if (bad == 0)
        printf("result: OK (%zu elements checked, max error %.2g)\n", n, max_err);
    else
        printf("result: FAIL (%zu of %zu elements wrong)\n", bad, n);
    printf("elapsed_ms: %.1f\n", t_read - t0);

    clReleaseMemObject(bx);
    clReleaseMemObject(by);
    clReleaseKernel(k_saxpy);
    clReleaseKernel(k_heavy);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    free(plats);
    free(x);
    free(y);
    free(out);
    return bad == 0 ? 0 : 1;
}
