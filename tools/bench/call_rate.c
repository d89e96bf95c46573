/* Calls per second of two kinds of OpenCL call through rgpu (or natively): clSetKernelArg,
 * answered in the client, and clEnqueueNDRangeKernel of an empty kernel, posted (one
 * clFinish per 1000). scripts/trace-overhead.sh runs it with tracing off and on.
 *
 *   call_rate PLATFORM_SUBSTRING CALLS
 * prints `set_arg_ns N` and `launch_ns N` (nanoseconds per call, the best of three passes). */
#include "bench_common.h"

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "rgpu";
    long calls = argc > 2 ? atol(argv[2]) : 100000;
    cl_device_id device = device_of_platform(want);
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
