/* Calls per second of two kinds of OpenCL call through rgpu (or natively): clSetKernelArg,
 * answered in the client, and clEnqueueNDRangeKernel of an empty kernel, posted (one
 * clFinish per 1000). scripts/trace-overhead.sh runs it with tracing off and on.
 *
 *   call_rate PLATFORM_SUBSTRING CALLS
 * prints `set_arg_ns N` and `launch_ns N` (nanoseconds per call, the best of three passes). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { \
    fprintf(stderr, "%s -> %d\n", #x, e_); exit(1); } } while (0)

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "rgpu";
    long calls = argc > 2 ? atol(argv[2]) : 100000;
    cl_platform_id platforms[16];
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(16, platforms, &n));
    cl_platform_id platform = NULL;
    for (cl_uint i = 0; i < n; i++) {
        char name[256] = "";
        clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, want)) { platform = platforms[i]; break; }
    }
    if (!platform) { fprintf(stderr, "no platform named *%s*\n", want); return 1; }
    cl_device_id device;
    CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL));
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err); CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err); CHECK(err);
    const char *src = "kernel void empty(int x) { }";
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
    CHECK(clBuildProgram(prog, 1, &device, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "empty", &err); CHECK(err);
    int x = 1;
    size_t global = 1;
    double best_arg = 1e9, best_launch = 1e9;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = now();
        for (long i = 0; i < calls; i++) CHECK(clSetKernelArg(k, 0, sizeof x, &x));
        double t1 = now();
        for (long i = 0; i < calls; i++) {
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
            if (i % 1000 == 999) CHECK(clFinish(q));
        }
        CHECK(clFinish(q));
        double t2 = now();
        if ((t1 - t0) / calls < best_arg) best_arg = (t1 - t0) / calls;
        if ((t2 - t1) / calls < best_launch) best_launch = (t2 - t1) / calls;
    }
    printf("set_arg_ns %.1f\nlaunch_ns %.1f\n", best_arg * 1e9, best_launch * 1e9);
    return 0;
}
