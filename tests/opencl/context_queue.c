/* Contexts and command queues: creation, info, retain/release, properties, errors. */
#include "common.h"

static const char *SRC =
    "__kernel void inc(__global int *a, int by) { a[get_global_id(0)] += by; }\n";

static cl_uint ctx_refcount(cl_context c) {
    cl_uint r = 0;
    CHECK(clGetContextInfo(c, CL_CONTEXT_REFERENCE_COUNT, sizeof r, &r, NULL));
    return r;
}

static cl_uint queue_refcount(cl_command_queue q) {
    cl_uint r = 0;
    CHECK(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof r, &r, NULL));
    return r;
}

/* Runs inc(by) over 1024 ints on queue q (of context ctx) and checks the result. */
static void use_queue(cl_context ctx, cl_command_queue q, cl_kernel k, int by, int out_of_order) {
    enum { N = 1024 };
    int host[N];
    for (int i = 0; i < N; i++) host[i] = i * 3;
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, E));
    cl_event ew, ek;
    CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, sizeof host, host, 0, NULL, &ew));
    CHECK(clSetKernelArg(k, 0, sizeof b, &b));
    CHECK(clSetKernelArg(k, 1, sizeof by, &by));
    size_t gws = N;
    /* On an out-of-order queue the kernel must wait for the write through its event. */
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gws, NULL, 1, &ew, &ek));
    int out[N];
    memset(out, 0, sizeof out);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof out, out, 1, &ek, NULL));
    for (int i = 0; i < N; i++)
        REQUIRE(out[i] == i * 3 + by, "out[%d]=%d expected %d (ooo=%d)", i, out[i], i * 3 + by,
                out_of_order);
    CHECK(clReleaseEvent(ew));
    CHECK(clReleaseEvent(ek));
    CHECK(clReleaseMemObject(b));
}

static void check_queue_info(cl_command_queue q, cl_context ctx, cl_command_queue_properties want) {
    cl_context c = NULL;
    cl_device_id d = NULL;
    cl_command_queue_properties p = 0;
    size_t n = 0;
    CHECK(clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof c, &c, &n));
    REQUIRE(c == ctx && n == sizeof c, "queue context %p", (void *)c);
    CHECK(clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof d, &d, &n));
    REQUIRE(d == g_device && n == sizeof d, "queue device %p", (void *)d);
    CHECK(clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof p, &p, &n));
    REQUIRE(p == want && n == sizeof p, "queue properties %#lx expected %#lx", (unsigned long)p,
            (unsigned long)want);
    REQUIRE(queue_refcount(q) == 1, "queue refcount %u", queue_refcount(q));
    CHECK(clRetainCommandQueue(q));
    REQUIRE(queue_refcount(q) == 2, "queue refcount after retain %u", queue_refcount(q));
    CHECK(clReleaseCommandQueue(q));
    REQUIRE(queue_refcount(q) == 1, "queue refcount after release %u", queue_refcount(q));
    EXPECT(CL_INVALID_VALUE, clGetCommandQueueInfo(q, 0x7fff, sizeof p, &p, NULL));
}

static volatile int g_destructor_called;
static void CL_CALLBACK ctx_destructor(cl_context c, void *ud) {
    (void)c;
    g_destructor_called = *(int *)ud;
}

int main(void) {
    select_device();
    int ver = device_version(g_device);

    /* clCreateContext with properties. */
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)g_platform, 0};
    cl_context ctx = CHKE(clCreateContext(props, 1, &g_device, ctx_notify, NULL, E));
    REQUIRE(ctx_refcount(ctx) == 1, "refcount %u", ctx_refcount(ctx));
    CHECK(clRetainContext(ctx));
    REQUIRE(ctx_refcount(ctx) == 2, "refcount after retain %u", ctx_refcount(ctx));
    CHECK(clReleaseContext(ctx));
    REQUIRE(ctx_refcount(ctx) == 1, "refcount after release %u", ctx_refcount(ctx));

    size_t n = 0;
    cl_device_id devs[4] = {0};
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, 0, NULL, &n));
    REQUIRE(n == sizeof(cl_device_id), "devices size %zu", n);
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof devs, devs, &n));
    REQUIRE(devs[0] == g_device, "context device %p expected %p", (void *)devs[0],
            (void *)g_device);
    cl_uint nd = 0;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof nd, &nd, &n));
    REQUIRE(nd == 1 && n == sizeof nd, "num devices %u", nd);
    cl_context_properties got[8] = {0};
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_PROPERTIES, 0, NULL, &n));
    REQUIRE(n == sizeof props, "properties size %zu expected %zu", n, sizeof props);
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_PROPERTIES, sizeof got, got, &n));
    REQUIRE(got[0] == CL_CONTEXT_PLATFORM && got[1] == (cl_context_properties)g_platform &&
                got[2] == 0, "properties %lx %lx %lx", (long)got[0], (long)got[1], (long)got[2]);
    EXPECT(CL_INVALID_VALUE, clGetContextInfo(ctx, 0x7fff, sizeof nd, &nd, NULL));
    EXPECT(CL_INVALID_VALUE, clGetContextInfo(ctx, CL_CONTEXT_DEVICES, 1, devs, NULL));

    cl_program prog = build_program(ctx, SRC, "");
    cl_kernel k = CHKE(clCreateKernel(prog, "inc", E));

    /* Queues: default, profiling, out-of-order (if supported), via both entry points. */
    cl_command_queue_properties supported = 0;
    CHECK(clGetDeviceInfo(g_device, CL_DEVICE_QUEUE_PROPERTIES, sizeof supported, &supported,
                          NULL));
    cl_command_queue q0 = CHKE(clCreateCommandQueue(ctx, g_device, 0, E));
    check_queue_info(q0, ctx, 0);
    use_queue(ctx, q0, k, 1, 0);
    cl_command_queue qp = CHKE(clCreateCommandQueue(ctx, g_device, CL_QUEUE_PROFILING_ENABLE, E));
    check_queue_info(qp, ctx, CL_QUEUE_PROFILING_ENABLE);
    use_queue(ctx, qp, k, 2, 0);
    if (supported & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) {
        cl_command_queue qo = CHKE(clCreateCommandQueue(
            ctx, g_device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE, E));
        check_queue_info(qo, ctx,
                         CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE);
        use_queue(ctx, qo, k, 3, 1);
        CHECK(clReleaseCommandQueue(qo));
    } else {
        NOTE("device has no out-of-order queues");
    }
    cl_queue_properties qprops[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_command_queue qw = CHKE(clCreateCommandQueueWithProperties(ctx, g_device, qprops, E));
    check_queue_info(qw, ctx, CL_QUEUE_PROFILING_ENABLE);
    use_queue(ctx, qw, k, 4, 0);
    cl_command_queue qn = CHKE(clCreateCommandQueueWithProperties(ctx, g_device, NULL, E));
    check_queue_info(qn, ctx, 0);
    use_queue(ctx, qn, k, 5, 0);
    if (ver >= 30) {
        cl_queue_properties pa[8] = {0};
        CHECK(clGetCommandQueueInfo(qw, CL_QUEUE_PROPERTIES_ARRAY, 0, NULL, &n));
        REQUIRE(n == sizeof qprops, "properties array size %zu expected %zu", n, sizeof qprops);
        CHECK(clGetCommandQueueInfo(qw, CL_QUEUE_PROPERTIES_ARRAY, sizeof pa, pa, NULL));
        REQUIRE(pa[0] == CL_QUEUE_PROPERTIES && pa[1] == CL_QUEUE_PROFILING_ENABLE && pa[2] == 0,
                "properties array %lx %lx %lx", (long)pa[0], (long)pa[1], (long)pa[2]);
        CHECK(clGetCommandQueueInfo(q0, CL_QUEUE_PROPERTIES_ARRAY, 0, NULL, &n));
        REQUIRE(n == 0, "properties array of clCreateCommandQueue queue: size %zu", n);
    }
    /* Two queues of one context see each other's results after clFinish. */
    {
        int v = 41, r = 0;
        cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof v, &v, E));
        CHECK(clSetKernelArg(k, 0, sizeof b, &b));
        int one = 1;
        CHECK(clSetKernelArg(k, 1, sizeof one, &one));
        size_t g = 1;
        CHECK(clEnqueueNDRangeKernel(q0, k, 1, NULL, &g, NULL, 0, NULL, NULL));
        CHECK(clFinish(q0));
        CHECK(clEnqueueReadBuffer(qn, b, CL_TRUE, 0, sizeof r, &r, 0, NULL, NULL));
        REQUIRE(r == 42, "cross-queue value %d", r);
        CHECK(clReleaseMemObject(b));
    }
    CHECK(clFlush(q0));
    CHECK(clFinish(q0));

    /* Queue errors. */
    EXPECTE(CL_INVALID_VALUE, clCreateCommandQueue(ctx, g_device, (cl_command_queue_properties)1
                                                   << 20, E));
    EXPECTE(CL_INVALID_DEVICE, clCreateCommandQueue(ctx, NULL, 0, E));
    EXPECTE(CL_INVALID_CONTEXT, clCreateCommandQueue(NULL, g_device, 0, E));
    EXPECTE(CL_INVALID_CONTEXT, clCreateCommandQueueWithProperties(NULL, g_device, NULL, E));
    {
        cl_queue_properties badp[] = {0x7fff, 1, 0};
        EXPECTE(CL_INVALID_VALUE, clCreateCommandQueueWithProperties(ctx, g_device, badp, E));
    }
    EXPECT(CL_INVALID_COMMAND_QUEUE, clFinish(NULL));
    EXPECT(CL_INVALID_COMMAND_QUEUE, clFlush(NULL));
    EXPECT(CL_INVALID_CONTEXT, clGetContextInfo(NULL, CL_CONTEXT_NUM_DEVICES, sizeof nd, &nd,
                                                NULL));
    EXPECTE(CL_INVALID_CONTEXT, clCreateBuffer(NULL, 0, 64, NULL, E));

    CHECK(clReleaseCommandQueue(q0));
    CHECK(clReleaseCommandQueue(qp));
    CHECK(clReleaseCommandQueue(qw));
    CHECK(clReleaseCommandQueue(qn));

    /* clCreateContext with NULL properties (the loader dispatches on the device). */
    cl_context c2 = CHKE(clCreateContext(NULL, 1, &g_device, NULL, NULL, E));
    CHECK(clGetContextInfo(c2, CL_CONTEXT_PROPERTIES, 0, NULL, &n));
    REQUIRE(n == 0 || n == sizeof(cl_context_properties), "NULL properties: size %zu", n);
    {
        cl_command_queue q = CHKE(clCreateCommandQueueWithProperties(c2, g_device, NULL, E));
        cl_program p2 = build_program(c2, SRC, "");
        cl_kernel k2 = CHKE(clCreateKernel(p2, "inc", E));
        use_queue(c2, q, k2, 6, 0);
        CHECK(clReleaseKernel(k2));
        CHECK(clReleaseProgram(p2));
        CHECK(clReleaseCommandQueue(q));
    }
    /* Queue, buffer and kernel keep their context alive after the application releases it. */
    {
        cl_context c3 = CHKE(clCreateContext(props, 1, &g_device, NULL, NULL, E));
        cl_command_queue q = CHKE(clCreateCommandQueueWithProperties(c3, g_device, NULL, E));
        cl_program p3 = build_program(c3, SRC, "");
        cl_kernel k3 = CHKE(clCreateKernel(p3, "inc", E));
        int v[64];
        for (int i = 0; i < 64; i++) v[i] = i;
        cl_mem b = CHKE(clCreateBuffer(c3, CL_MEM_COPY_HOST_PTR, sizeof v, v, E));
        CHECK(clReleaseContext(c3));
        CHECK(clReleaseProgram(p3));
        int by = 9;
        CHECK(clSetKernelArg(k3, 0, sizeof b, &b));
        CHECK(clSetKernelArg(k3, 1, sizeof by, &by));
        size_t g = 64;
        CHECK(clEnqueueNDRangeKernel(q, k3, 1, NULL, &g, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof v, v, 0, NULL, NULL));
        for (int i = 0; i < 64; i++) REQUIRE(v[i] == i + 9, "v[%d]=%d", i, v[i]);
        CHECK(clReleaseMemObject(b));
        CHECK(clReleaseKernel(k3));
        CHECK(clReleaseCommandQueue(q));
    }
    CHECK(clReleaseContext(c2));

    /* clCreateContextFromType. */
    cl_uint n_all = 0;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n_all));
    cl_context ct = CHKE(clCreateContextFromType(props, CL_DEVICE_TYPE_ALL, NULL, NULL, E));
    CHECK(clGetContextInfo(ct, CL_CONTEXT_NUM_DEVICES, sizeof nd, &nd, NULL));
    REQUIRE(nd == n_all, "from type ALL: %u devices, platform has %u", nd, n_all);
    {
        cl_device_id *ds = calloc(nd, sizeof *ds);
        CHECK(clGetContextInfo(ct, CL_CONTEXT_DEVICES, nd * sizeof *ds, ds, NULL));
        cl_platform_id pl = NULL;
        CHECK(clGetDeviceInfo(ds[0], CL_DEVICE_PLATFORM, sizeof pl, &pl, NULL));
        REQUIRE(pl == g_platform, "device of context from type on another platform");
        cl_command_queue q = CHKE(clCreateCommandQueueWithProperties(ct, ds[0], NULL, E));
        const char *src = SRC;
        cl_program p = CHKE(clCreateProgramWithSource(ct, 1, &src, NULL, E));
        CHECK(clBuildProgram(p, 0, NULL, "", NULL, NULL)); /* all devices of the context */
        cl_kernel kk = CHKE(clCreateKernel(p, "inc", E));
        cl_device_id save = g_device;
        g_device = ds[0];
        use_queue(ct, q, kk, 8, 0);
        g_device = save;
        CHECK(clReleaseKernel(kk));
        CHECK(clReleaseProgram(p));
        CHECK(clReleaseCommandQueue(q));
        free(ds);
    }
    CHECK(clReleaseContext(ct));
    ct = CHKE(clCreateContextFromType(props, CL_DEVICE_TYPE_DEFAULT, NULL, NULL, E));
    CHECK(clGetContextInfo(ct, CL_CONTEXT_NUM_DEVICES, sizeof nd, &nd, NULL));
    REQUIRE(nd >= 1, "from type DEFAULT: %u devices", nd);
    CHECK(clReleaseContext(ct));
    {
        cl_device_type ty = 0;
        CHECK(clGetDeviceInfo(g_device, CL_DEVICE_TYPE, sizeof ty, &ty, NULL));
        cl_device_type absent = (ty & CL_DEVICE_TYPE_GPU) ? CL_DEVICE_TYPE_ACCELERATOR
                                                          : CL_DEVICE_TYPE_GPU;
        cl_uint cnt = 0;
        if (clGetDeviceIDs(g_platform, absent, 0, NULL, &cnt) == CL_DEVICE_NOT_FOUND)
            /* PoCL returns a non-NULL context along with the error. */
            EXPECTE_CODE(CL_DEVICE_NOT_FOUND, clCreateContextFromType(props, absent, NULL, NULL, E));
    }

    /* Context errors. */
    EXPECTE(CL_INVALID_VALUE, clCreateContext(props, 0, &g_device, NULL, NULL, E));
    EXPECTE(CL_INVALID_VALUE, clCreateContext(props, 1, NULL, NULL, NULL, E));
    {
        cl_device_id nulldev = NULL;
        EXPECTE(CL_INVALID_DEVICE, clCreateContext(props, 1, &nulldev, NULL, NULL, E));
        cl_context_properties badprops[] = {0x7fff, 0, 0};
        t_err_ = -9999;
        cl_context bad = clCreateContext(badprops, 1, &g_device, NULL, NULL, E);
        REQUIRE(bad == NULL && (t_err_ == CL_INVALID_PROPERTY || t_err_ == CL_INVALID_PLATFORM),
                "unknown context property: err %d (%s)", t_err_, cl_err_name(t_err_));
    }
    /* A device of another platform (when one is listed, e.g. PoCL beside rgpu). */
    {
        cl_uint np = 0;
        CHECK(clGetPlatformIDs(0, NULL, &np));
        cl_platform_id *ps = calloc(np, sizeof *ps);
        CHECK(clGetPlatformIDs(np, ps, NULL));
        for (cl_uint i = 0; i < np; i++) {
            if (ps[i] == g_platform) continue;
            cl_device_id other = NULL;
            if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 1, &other, NULL) != CL_SUCCESS) continue;
            EXPECTE(CL_INVALID_DEVICE, clCreateContext(props, 1, &other, NULL, NULL, E));
            EXPECTE(CL_INVALID_DEVICE, clCreateCommandQueueWithProperties(ctx, other, NULL, E));
        }
        free(ps);
    }

    /* Context destructor callback (OpenCL 3.0). */
    if (ver >= 30) {
        cl_context c4 = CHKE(clCreateContext(props, 1, &g_device, NULL, NULL, E));
        static int tag = 77;
        cl_int err = clSetContextDestructorCallback(c4, ctx_destructor, &tag);
        if (err == CL_SUCCESS) {
            CHECK(clReleaseContext(c4));
            for (int i = 0; i < 3000 && !g_destructor_called; i++) sleep_ms(10);
            REQUIRE(g_destructor_called == 77, "context destructor callback not called (%d)",
                    g_destructor_called);
        } else {
            REQUIRE(err == CL_INVALID_OPERATION, "clSetContextDestructorCallback: %d (%s)", err,
                    cl_err_name(err));
            NOTE("clSetContextDestructorCallback not supported");
            CHECK(clReleaseContext(c4));
        }
    }

    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseContext(ctx));
    pass("context_queue");
    return 0;
}
