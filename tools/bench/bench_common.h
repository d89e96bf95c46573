/* What the OpenCL benchmark tools share: a monotonic clock, a check that exits on an error,
 * and the first device of the first platform whose name contains a string. */
#ifndef RGPU_BENCH_COMMON_H
#define RGPU_BENCH_COMMON_H
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

/* The first device of the first platform whose name contains `want`; exits if there is none. */
static cl_device_id device_of_platform(const char *want) {
    cl_platform_id platforms[16];
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(16, platforms, &n));
    for (cl_uint i = 0; i < n; i++) {
        char name[256] = "";
        clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, want)) {
            cl_device_id device;
            CHECK(clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_ALL, 1, &device, NULL));
            return device;
        }
    }
    fprintf(stderr, "no platform named *%s*\n", want);
    exit(1);
}
#endif
