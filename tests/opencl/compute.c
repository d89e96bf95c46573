/* Compute: how OpenCL benchmarks drive a device (the shape of clpeak's runs): several programs
 * built from source in one context, each with one kernel per vector width (1, 2, 4, 8, 16) —
 * single precision, integer, 24-bit integer, char and short, double and half where the device
 * has them — plus a bandwidth program and an empty kernel; every kernel's work-group info is
 * asked, and each runs at the kernel's own work-group size and at 64, its result checked
 * against the host's (the arithmetic is exact: counts that stay within the type's range).
 * As clpeak does, the context is made from a device type, the queue profiles, each kernel also
 * runs at the device's largest work-group size clamped to the kernel's, its timed launches'
 * profiling read back, and a transfer section maps an ALLOC_HOST_PTR buffer for reading and
 * writing. Issue 22's NVIDIA case: a benchmark's compute kernels crashed the session's worker. */
#include "common.h"

static cl_context ctx;
static cl_command_queue q;
static size_t g_max_wg;

#define ITEMS 4096
#define ROUNDS 32

/* One program per element type: kernels compute_<tag>_v<w>, each item starting from its own
 * index and adding `step` ROUNDS times through mad() chains (or + where mad has no such type). */
static char *compute_source(const char *type, const char *tag, const char *pragma, int use_mad) {
    static const int widths[] = {1, 2, 4, 8, 16};
    size_t cap = 16384, len = 0;
    char *src = malloc(cap);
    len += snprintf(src + len, cap - len, "%s\n", pragma ? pragma : "");
    for (int i = 0; i < 5; i++) {
        int w = widths[i];
        char vt[32];
        if (w == 1) snprintf(vt, sizeof vt, "%s", type);
        else snprintf(vt, sizeof vt, "%s%d", type, w);
        char step[96];
        if (use_mad) snprintf(step, sizeof step, "mad(x, one, (%s)step)", vt);
        else snprintf(step, sizeof step, "x * one + (%s)step", vt);
        len += snprintf(src + len, cap - len,
                        "__kernel void compute_%s_v%d(__global %s *out, %s step) {\n"
                        "    int gid = get_global_id(0);\n"
                        "    %s x = (%s)((%s)(gid %% 64));\n"
                        "    %s one = (%s)((%s)1);\n"
                        "    for (int r = 0; r < %d; r++) {\n"
                        "        x = %s;\n"
                        "    }\n"
                        "    out[gid] = x;\n"
                        "}\n",
                        tag, w, vt, type, vt, vt, type, vt, vt, type, ROUNDS, step);
    }
    return src;
}

/* Runs compute_<tag>_v<w> at local size `local` and checks each lane: gid % 64 + ROUNDS*step. */
static void run_compute(cl_program p, const char *tag, int w, size_t elem, size_t local,
                        int (*lane_ok)(const void *, size_t, long)) {
    char name[64];
    snprintf(name, sizeof name, "compute_%s_v%d", tag, w);
    cl_kernel k = CHKE(clCreateKernel(p, name, E));
    size_t wgs = 0, pref = 0;
    CHECK(clGetKernelWorkGroupInfo(k, g_device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wgs, &wgs, NULL));
    CHECK(clGetKernelWorkGroupInfo(k, g_device, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                   sizeof pref, &pref, NULL));
    REQUIRE(wgs >= 1 && pref >= 1, "%s: work-group size %zu, multiple %zu", name, wgs, pref);
    if (local == 0) local = wgs > 256 ? 256 : wgs;
    /* SIZE_MAX: the device's largest work-group, clamped to the kernel's (clpeak's launch). */
    if (local == SIZE_MAX) local = wgs < g_max_wg ? wgs : g_max_wg;
    while (ITEMS % local) local /= 2;
    size_t bytes = ITEMS * elem * w, global = ITEMS;
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, bytes, NULL, E));
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    /* The step, 1, in the kernel's scalar type. */
    unsigned char step[8] = {0};
    if (!strcmp(tag, "sp")) *(float *)step = 1.0f;
    else if (!strcmp(tag, "dp")) *(double *)step = 1.0;
    else if (!strcmp(tag, "hp")) *(uint16_t *)step = 0x3c00; /* 1.0 in half */
    else if (!strcmp(tag, "char")) *(int8_t *)step = 1;
    else if (!strcmp(tag, "short")) *(int16_t *)step = 1;
    else *(int32_t *)step = 1;
    CHECK(clSetKernelArg(k, 1, elem, step));
    cl_event timed;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, &timed));
    CHECK(clWaitForEvents(1, &timed));
    cl_ulong start = 0, end = 0;
    CHECK(clGetEventProfilingInfo(timed, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL));
    CHECK(clGetEventProfilingInfo(timed, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL));
    REQUIRE(end >= start && start > 0, "%s: profiled start %llu end %llu", name,
            (unsigned long long)start, (unsigned long long)end);
    CHECK(clReleaseEvent(timed));
    unsigned char *host = malloc(bytes);
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
    for (size_t i = 0; i < ITEMS; i++)
        for (int l = 0; l < w; l++)
            REQUIRE(lane_ok(host + (i * w + l) * elem, 0, (long)(i % 64) + ROUNDS),
                    "%s local %zu: item %zu lane %d wrong", name, local, i, l);
    free(host);
    CHECK(clReleaseMemObject(out));
    CHECK(clReleaseKernel(k));
}

static int ok_f32(const void *v, size_t i, long want) { (void)i; return *(const float *)v == (float)want; }
static int ok_f64(const void *v, size_t i, long want) { (void)i; return *(const double *)v == (double)want; }
static int ok_i32(const void *v, size_t i, long want) { (void)i; return *(const int32_t *)v == want; }
static int ok_i16(const void *v, size_t i, long want) { (void)i; return *(const int16_t *)v == want; }
static int ok_i8(const void *v, size_t i, long want) { (void)i; return *(const int8_t *)v == want; }
/* Half: the wanted values (0..95) are exact in half; compare the bit pattern. */
static int ok_f16(const void *v, size_t i, long want) {
    (void)i;
    uint16_t h = *(const uint16_t *)v;
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double value = e == 0 ? m / 1024.0 / 16384.0 : (1.0 + m / 1024.0) * (double)(1 << e) / 32768.0;
    return (h >> 15) == 0 && value == (double)want;
}

static const char *BANDWIDTH =
    "__kernel void read_v1(__global const float *in, __global float *out) {\n"
    "    int g = get_global_id(0); out[g] = in[g] + 1.0f; }\n"
    "__kernel void read_v4(__global const float4 *in, __global float4 *out) {\n"
    "    int g = get_global_id(0); out[g] = in[g] + (float4)(1.0f); }\n"
    "__kernel void read_v16(__global const float16 *in, __global float16 *out) {\n"
    "    int g = get_global_id(0); out[g] = in[g] + (float16)(1.0f); }\n"
    "__kernel void empty(void) { }\n";

static void run_bandwidth(cl_program p) {
    static const int widths[] = {1, 4, 16};
    size_t n = ITEMS * 16;
    float *host = malloc(n * sizeof *host);
    for (size_t i = 0; i < n; i++) host[i] = (float)(i % 1000);
    cl_mem in = CHKE(clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof *host,
                                    host, E));
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, n * sizeof *host, NULL, E));
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "read_v%d", widths[i]);
        cl_kernel k = CHKE(clCreateKernel(p, name, E));
        CHECK(clSetKernelArg(k, 0, sizeof in, &in));
        CHECK(clSetKernelArg(k, 1, sizeof out, &out));
        size_t global = n / widths[i];
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
        float *back = calloc(n, sizeof *back);
        CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, n * sizeof *back, back, 0, NULL, NULL));
        for (size_t j = 0; j < n; j++)
            REQUIRE(back[j] == host[j] + 1.0f, "%s: element %zu", name, j);
        free(back);
        CHECK(clReleaseKernel(k));
    }
    /* Kernel latency: an empty kernel, many times, one finish. */
    cl_kernel k = CHKE(clCreateKernel(p, "empty", E));
    size_t one = 1;
    for (int i = 0; i < 100; i++) CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseMemObject(in));
    CHECK(clReleaseMemObject(out));
    free(host);
}

/* Transfers the way clpeak's transfer test makes them, on an ALLOC_HOST_PTR buffer: blocking and
 * non-blocking writes and reads, a map for reading, a map for writing and its unmap; the data
 * written through the mapping is read back. */
static void run_transfers(void) {
    size_t n = 1 << 20, bytes = n * sizeof(float);
    float *host = malloc(bytes), *back = malloc(bytes);
    for (size_t i = 0; i < n; i++) host[i] = (float)(i % 4093);
    cl_mem buf = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, E));
    for (int round = 0; round < 3; round++) {
        CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, bytes, back, 0, NULL, NULL));
        CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, bytes, host, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, bytes, back, 0, NULL, NULL));
        CHECK(clFinish(q));
        REQUIRE(!memcmp(back, host, bytes), "round %d: read back differs", round);
        float *m = CHKE(clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_READ, 0, bytes, 0, NULL, NULL, E));
        REQUIRE(!memcmp(m, host, bytes), "round %d: mapped for reading differs", round);
        CHECK(clEnqueueUnmapMemObject(q, buf, m, 0, NULL, NULL));
        CHECK(clFinish(q));
        m = CHKE(clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_WRITE, 0, bytes, 0, NULL, NULL, E));
        for (size_t i = 0; i < n; i++) m[i] = (float)(round + i % 17);
        cl_event unmapped;
        CHECK(clEnqueueUnmapMemObject(q, buf, m, 0, NULL, &unmapped));
        CHECK(clWaitForEvents(1, &unmapped));
        CHECK(clReleaseEvent(unmapped));
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, bytes, back, 0, NULL, NULL));
        for (size_t i = 0; i < n; i++)
            REQUIRE(back[i] == (float)(round + i % 17), "round %d: element %zu after unmap", round, i);
    }
    CHECK(clReleaseMemObject(buf));
    free(host);
    free(back);
}

/* A context of every device of the selected platform, from the type (clCreateContextFromType);
 * the selected device must be among them. */
static cl_context make_context_from_type(void) {
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)g_platform, 0};
    cl_context c = CHKE(clCreateContextFromType(props, CL_DEVICE_TYPE_ALL, ctx_notify, NULL, E));
    size_t n = 0;
    CHECK(clGetContextInfo(c, CL_CONTEXT_DEVICES, 0, NULL, &n));
    cl_device_id *devs = malloc(n);
    CHECK(clGetContextInfo(c, CL_CONTEXT_DEVICES, n, devs, NULL));
    int found = 0;
    for (size_t i = 0; i < n / sizeof *devs; i++) found |= devs[i] == g_device;
    free(devs);
    REQUIRE(found, "the selected device is not in the context made from CL_DEVICE_TYPE_ALL");
    return c;
}

int main(void) {
    select_device();
    ctx = make_context_from_type();
    q = make_queue(ctx, CL_QUEUE_PROFILING_ENABLE);
    g_max_wg = device_size(g_device, CL_DEVICE_MAX_WORK_GROUP_SIZE);

    struct {
        const char *type, *tag, *pragma, *needs;
        size_t elem;
        int mad;
        int (*ok)(const void *, size_t, long);
    } kinds[] = {
        {"float", "sp", NULL, NULL, 4, 1, ok_f32},
        {"int", "int", NULL, NULL, 4, 0, ok_i32},
        {"short", "short", NULL, NULL, 2, 0, ok_i16},
        {"char", "char", NULL, NULL, 1, 0, ok_i8},
        {"double", "dp", "#pragma OPENCL EXTENSION cl_khr_fp64 : enable", "cl_khr_fp64", 8, 1, ok_f64},
        {"half", "hp", "#pragma OPENCL EXTENSION cl_khr_fp16 : enable", "cl_khr_fp16", 2, 1, ok_f16},
    };
    size_t nkinds = sizeof kinds / sizeof kinds[0];
    /* Every program built first, in one context, as a benchmark sets up; then every kernel. */
    cl_program programs[8] = {0};
    int built = 0;
    for (size_t i = 0; i < nkinds; i++) {
        if (kinds[i].needs && !has_extension(g_device, kinds[i].needs)) continue;
        char *src = compute_source(kinds[i].type, kinds[i].tag, kinds[i].pragma, kinds[i].mad);
        programs[i] = build_program(ctx, src, "-cl-mad-enable");
        free(src);
        built++;
    }
    cl_program bandwidth = build_program(ctx, BANDWIDTH, "-cl-fast-relaxed-math");
    REQUIRE(built >= 4, "only %d compute programs built", built);
    static const int widths[] = {1, 2, 4, 8, 16};
    for (size_t i = 0; i < nkinds; i++) {
        if (!programs[i]) continue;
        for (int wi = 0; wi < 5; wi++) {
            run_compute(programs[i], kinds[i].tag, widths[wi], kinds[i].elem, 0, kinds[i].ok);
            run_compute(programs[i], kinds[i].tag, widths[wi], kinds[i].elem, 64, kinds[i].ok);
            run_compute(programs[i], kinds[i].tag, widths[wi], kinds[i].elem, SIZE_MAX, kinds[i].ok);
        }
    }
    run_bandwidth(bandwidth);
    run_transfers();
    for (size_t i = 0; i < nkinds; i++)
        if (programs[i]) CHECK(clReleaseProgram(programs[i]));
    CHECK(clReleaseProgram(bandwidth));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    pass("compute");
    return 0;
}
