/* Shared helpers for the rgpu OpenCL API-group test programs.
 *
 * Platform selection: env RGPU_TEST_PLATFORM is a substring of CL_PLATFORM_NAME
 * ("rgpu" for the remote platform, "Portable" for PoCL); unset = first platform.
 * Every check prints nothing on success; on failure it prints file:line, the call and
 * the error code (number and name) to stderr and exits 1.  A program that reaches its
 * end prints "PASS <group>" and exits 0.
 */
#ifndef RGPU_TEST_COMMON_H
#define RGPU_TEST_COMMON_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_2_0_APIS
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CL_DEVICE_RGPU_SERVER 0x52470001

static const char *cl_err_name(cl_int e) {
    switch (e) {
#define E_(x) case x: return #x;
        E_(CL_SUCCESS) E_(CL_DEVICE_NOT_FOUND) E_(CL_DEVICE_NOT_AVAILABLE)
        E_(CL_COMPILER_NOT_AVAILABLE) E_(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        E_(CL_OUT_OF_RESOURCES) E_(CL_OUT_OF_HOST_MEMORY)
        E_(CL_PROFILING_INFO_NOT_AVAILABLE) E_(CL_MEM_COPY_OVERLAP)
        E_(CL_IMAGE_FORMAT_MISMATCH) E_(CL_IMAGE_FORMAT_NOT_SUPPORTED)
        E_(CL_BUILD_PROGRAM_FAILURE) E_(CL_MAP_FAILURE)
        E_(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        E_(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) E_(CL_COMPILE_PROGRAM_FAILURE)
        E_(CL_LINKER_NOT_AVAILABLE) E_(CL_LINK_PROGRAM_FAILURE)
        E_(CL_DEVICE_PARTITION_FAILED) E_(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
        E_(CL_INVALID_VALUE) E_(CL_INVALID_DEVICE_TYPE) E_(CL_INVALID_PLATFORM)
        E_(CL_INVALID_DEVICE) E_(CL_INVALID_CONTEXT) E_(CL_INVALID_QUEUE_PROPERTIES)
        E_(CL_INVALID_COMMAND_QUEUE) E_(CL_INVALID_HOST_PTR) E_(CL_INVALID_MEM_OBJECT)
        E_(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) E_(CL_INVALID_IMAGE_SIZE)
        E_(CL_INVALID_SAMPLER) E_(CL_INVALID_BINARY) E_(CL_INVALID_BUILD_OPTIONS)
        E_(CL_INVALID_PROGRAM) E_(CL_INVALID_PROGRAM_EXECUTABLE)
        E_(CL_INVALID_KERNEL_NAME) E_(CL_INVALID_KERNEL_DEFINITION) E_(CL_INVALID_KERNEL)
        E_(CL_INVALID_ARG_INDEX) E_(CL_INVALID_ARG_VALUE) E_(CL_INVALID_ARG_SIZE)
        E_(CL_INVALID_KERNEL_ARGS) E_(CL_INVALID_WORK_DIMENSION)
        E_(CL_INVALID_WORK_GROUP_SIZE) E_(CL_INVALID_WORK_ITEM_SIZE)
        E_(CL_INVALID_GLOBAL_OFFSET) E_(CL_INVALID_EVENT_WAIT_LIST) E_(CL_INVALID_EVENT)
        E_(CL_INVALID_OPERATION) E_(CL_INVALID_GL_OBJECT) E_(CL_INVALID_BUFFER_SIZE)
        E_(CL_INVALID_MIP_LEVEL) E_(CL_INVALID_GLOBAL_WORK_SIZE) E_(CL_INVALID_PROPERTY)
        E_(CL_INVALID_IMAGE_DESCRIPTOR) E_(CL_INVALID_COMPILER_OPTIONS)
        E_(CL_INVALID_LINKER_OPTIONS) E_(CL_INVALID_DEVICE_PARTITION_COUNT)
        E_(CL_INVALID_PIPE_SIZE) E_(CL_INVALID_DEVICE_QUEUE)
        E_(CL_INVALID_SPEC_ID) E_(CL_MAX_SIZE_RESTRICTION_EXCEEDED)
#undef E_
    default: return e < 0 ? "(unknown error)" : "(positive value)";
    }
}

static void t_fail(const char *file, int line, const char *what, cl_int err) {
    fprintf(stderr, "FAIL %s:%d: %s -> %d (%s)\n", file, line, what, (int)err,
            cl_err_name(err));
    fflush(stderr);
    exit(1);
}

/* CHECK(call): call returns cl_int, must be CL_SUCCESS. */
#define CHECK(call)                                                                   \
    do {                                                                              \
        cl_int c_err_ = (call);                                                       \
        if (c_err_ != CL_SUCCESS) t_fail(__FILE__, __LINE__, #call, c_err_);          \
    } while (0)

/* CHKE(expr): expr is a creation call whose last argument is the macro E; the error must be
 * CL_SUCCESS and the result non-NULL.  Evaluates to the result.
 *   cl_mem b = CHKE(clCreateBuffer(ctx, 0, n, NULL, E)); */
static cl_int t_err_;
#define E (&t_err_)
#define CHKE(expr)                                                                    \
    __extension__({                                                                   \
        t_err_ = -9999;                                                               \
        __auto_type c_r_ = (expr);                                                    \
        if (t_err_ != CL_SUCCESS) t_fail(__FILE__, __LINE__, #expr, t_err_);          \
        if (!c_r_) t_fail(__FILE__, __LINE__, #expr " returned NULL", t_err_);        \
        c_r_;                                                                         \
    })

/* EXPECT(code, call): call returns cl_int, must be exactly code. */
#define EXPECT(code, call)                                                            \
    do {                                                                              \
        cl_int c_err_ = (call);                                                       \
        if (c_err_ != (code)) {                                                       \
            fprintf(stderr, "FAIL %s:%d: %s -> %d (%s), expected %d (%s)\n", __FILE__,  \
                    __LINE__, #call, (int)c_err_, cl_err_name(c_err_), (int)(code),    \
                    cl_err_name(code));                                               \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* EXPECT_ENQ(code, queue, call): an enqueue that must fail with code, either at the call or, as
 * a remoting implementation may do for non-blocking commands, at the next synchronization point
 * (clFinish(queue)); the latter is noted on stdout. */
#define EXPECT_ENQ(code, queue, call)                                                 \
    do {                                                                              \
        cl_int e1_ = (call);                                                          \
        if (e1_ == CL_SUCCESS) {                                                      \
            cl_int e2_ = clFinish(queue);                                             \
            if (e2_ != (code)) {                                                      \
                fprintf(stderr, "FAIL %s:%d: %s -> CL_SUCCESS and clFinish -> %d (%s), "  \
                        "expected %d (%s) from either\n", __FILE__, __LINE__, #call,     \
                        (int)e2_, cl_err_name(e2_), (int)(code), cl_err_name(code));   \
                exit(1);                                                              \
            }                                                                         \
            printf("NOTE: %s:%d: %s reported at clFinish, not at the call\n", __FILE__,  \
                   __LINE__, cl_err_name(code));                                      \
            fflush(stdout);                                                           \
        } else if (e1_ != (code)) {                                                   \
            fprintf(stderr, "FAIL %s:%d: %s -> %d (%s), expected %d (%s)\n", __FILE__,  \
                    __LINE__, #call, (int)e1_, cl_err_name(e1_), (int)(code),          \
                    cl_err_name(code));                                               \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* EXPECTE(code, expr): creation call with last argument E must fail with code and NULL. */
#define EXPECTE(code, expr)                                                           \
    do {                                                                              \
        t_err_ = -9999;                                                               \
        __auto_type c_r_ = (expr);                                                    \
        if (t_err_ != (code) || c_r_) {                                               \
            fprintf(stderr, "FAIL %s:%d: %s -> %d (%s) result %p, expected %d (%s)\n",  \
                    __FILE__, __LINE__, #expr, (int)t_err_, cl_err_name(t_err_),       \
                    (void *)(uintptr_t)c_r_, (int)(code), cl_err_name(code));         \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* EXPECTE_CODE(code, expr): like EXPECTE but only the error code is checked (PoCL returns
 * non-NULL objects with some errors). */
#define EXPECTE_CODE(code, expr)                                                      \
    do {                                                                              \
        t_err_ = -9999;                                                               \
        (void)(expr);                                                                 \
        if (t_err_ != (code)) {                                                       \
            fprintf(stderr, "FAIL %s:%d: %s -> %d (%s), expected %d (%s)\n", __FILE__,  \
                    __LINE__, #expr, (int)t_err_, cl_err_name(t_err_), (int)(code),    \
                    cl_err_name(code));                                               \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* EXPECT_FAIL(call): call returns cl_int, must be an error (any). Evaluates nothing. */
#define EXPECT_FAIL(call)                                                             \
    do {                                                                              \
        cl_int c_err_ = (call);                                                       \
        if (c_err_ == CL_SUCCESS) {                                                   \
            fprintf(stderr, "FAIL %s:%d: %s -> CL_SUCCESS, expected an error\n",        \
                    __FILE__, __LINE__, #call);                                       \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* REQUIRE(cond, fmt, ...): a value check. */
#define REQUIRE(cond, ...)                                                            \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
            fflush(stderr);                                                           \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define NOTE(...)                                                                     \
    do {                                                                              \
        printf("NOTE: " __VA_ARGS__);                                                 \
        printf("\n");                                                                 \
        fflush(stdout);                                                               \
    } while (0)

/* ---- platform / device selection ---- */

static cl_platform_id g_platform;
static cl_device_id g_device;
static int g_remote; /* selected platform is rgpu */

static char *platform_str(cl_platform_id p, cl_platform_info what) {
    size_t n = 0;
    CHECK(clGetPlatformInfo(p, what, 0, NULL, &n));
    char *s = calloc(n + 1, 1);
    CHECK(clGetPlatformInfo(p, what, n, s, NULL));
    return s;
}

static char *device_str(cl_device_id d, cl_device_info what) {
    size_t n = 0;
    CHECK(clGetDeviceInfo(d, what, 0, NULL, &n));
    char *s = calloc(n + 1, 1);
    CHECK(clGetDeviceInfo(d, what, n, s, NULL));
    return s;
}

static cl_uint device_uint(cl_device_id d, cl_device_info what) {
    cl_uint v = 0;
    CHECK(clGetDeviceInfo(d, what, sizeof v, &v, NULL));
    return v;
}

static cl_ulong device_ulong(cl_device_id d, cl_device_info what) {
    cl_ulong v = 0;
    CHECK(clGetDeviceInfo(d, what, sizeof v, &v, NULL));
    return v;
}

static size_t device_size(cl_device_id d, cl_device_info what) {
    size_t v = 0;
    CHECK(clGetDeviceInfo(d, what, sizeof v, &v, NULL));
    return v;
}

/* "OpenCL X.Y ..." -> X*10+Y */
static int parse_cl_version(const char *s) {
    int maj = 0, min = 0;
    if (sscanf(s, "OpenCL %d.%d", &maj, &min) != 2) return 0;
    return maj * 10 + min;
}

static int device_version(cl_device_id d) {
    char *v = device_str(d, CL_DEVICE_VERSION);
    int r = parse_cl_version(v);
    free(v);
    return r;
}

static int has_extension(cl_device_id d, const char *ext) {
    char *s = device_str(d, CL_DEVICE_EXTENSIONS);
    size_t n = strlen(ext);
    int found = 0;
    for (char *p = s; (p = strstr(p, ext)) != NULL; p += n) {
        if ((p == s || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) {
            found = 1;
            break;
        }
    }
    free(s);
    return found;
}

/* Finds a platform whose name contains `want` (NULL = first platform); 0 if none. */
static cl_platform_id find_platform(const char *want) {
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(0, NULL, &n));
    REQUIRE(n > 0, "no OpenCL platforms");
    cl_platform_id *ps = calloc(n, sizeof *ps);
    CHECK(clGetPlatformIDs(n, ps, NULL));
    cl_platform_id found = NULL;
    for (cl_uint i = 0; i < n && !found; i++) {
        char *name = platform_str(ps[i], CL_PLATFORM_NAME);
        if (!want || !*want || strstr(name, want)) found = ps[i];
        free(name);
    }
    free(ps);
    return found;
}

/* Selects g_platform / g_device (the first device of any type on the platform). */
static void select_device(void) {
    const char *want = getenv("RGPU_TEST_PLATFORM");
    g_platform = find_platform(want);
    if (!g_platform) {
        fprintf(stderr, "FAIL: no OpenCL platform whose name contains '%s'\n", want);
        cl_uint n = 0;
        clGetPlatformIDs(0, NULL, &n);
        cl_platform_id ps[16];
        if (n > 16) n = 16;
        clGetPlatformIDs(n, ps, NULL);
        for (cl_uint i = 0; i < n; i++) {
            char *name = platform_str(ps[i], CL_PLATFORM_NAME);
            fprintf(stderr, "  platform %u: %s\n", i, name);
            free(name);
        }
        exit(1);
    }
    char *name = platform_str(g_platform, CL_PLATFORM_NAME);
    g_remote = strcmp(name, "rgpu") == 0;
    free(name);
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 1, &g_device, NULL));
}

static void CL_CALLBACK ctx_notify(const char *errinfo, const void *pi, size_t cb, void *ud) {
    (void)pi; (void)cb; (void)ud;
    fprintf(stderr, "context notify: %s\n", errinfo);
}

static cl_context make_context(void) {
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)g_platform, 0};
    return CHKE(clCreateContext(props, 1, &g_device, ctx_notify, NULL, E));
}

static cl_command_queue make_queue(cl_context ctx, cl_command_queue_properties p) {
    cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, p, 0};
    return CHKE(clCreateCommandQueueWithProperties(ctx, g_device, p ? props : NULL, E));
}

/* Builds `src` with `opts`; on failure prints the build log and exits. */
#define build_program(ctx, src, opts) build_program_at(__FILE__, __LINE__, ctx, src, opts)
static cl_program build_program_at(const char *file, int line, cl_context ctx, const char *src,
                                   const char *opts) {
    cl_int err = -9999;
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (err != CL_SUCCESS || !p) t_fail(file, line, "clCreateProgramWithSource", err);
    err = clBuildProgram(p, 1, &g_device, opts, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t n = 0;
        clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
        char *log = calloc(n + 1, 1);
        clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BUILD_LOG, n, log, NULL);
        fprintf(stderr, "build log:\n%s\n", log);
        t_fail(file, line, "clBuildProgram", err);
    }
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Deterministic pseudo-random numbers. */
static uint32_t t_rng = 12345u;
static uint32_t rnd(void) {
    t_rng = t_rng * 1664525u + 1013904223u;
    return t_rng >> 8;
}

static void pass(const char *group) {
    printf("PASS %s%s\n", group, g_remote ? " (rgpu)" : "");
    fflush(stdout);
}

#endif
