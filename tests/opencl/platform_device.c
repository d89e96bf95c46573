/* Platform and device queries, device ids by type, sub-devices, retain/release. */
#include "common.h"

static const char *SRC =
    "__kernel void sq(__global int *a) { size_t i = get_global_id(0); a[i] = a[i] * a[i]; }\n";

enum kind { K_STR, K_UINT, K_ULONG, K_SIZE, K_BOOL, K_BITS, K_PTR, K_ARRAY };
struct q {
    cl_device_info param;
    const char *name;
    enum kind kind;
    int min_version; /* device version needed (e.g. 12, 20, 30) */
};

#define Q(p, k, v) {p, #p, k, v}
static const struct q QUERIES[] = {
    Q(CL_DEVICE_TYPE, K_BITS, 10),
    Q(CL_DEVICE_VENDOR_ID, K_UINT, 10),
    Q(CL_DEVICE_MAX_COMPUTE_UNITS, K_UINT, 10),
    Q(CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, K_UINT, 10),
    Q(CL_DEVICE_MAX_WORK_ITEM_SIZES, K_ARRAY, 10),
    Q(CL_DEVICE_MAX_WORK_GROUP_SIZE, K_SIZE, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_CHAR, K_UINT, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_SHORT, K_UINT, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_INT, K_UINT, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_LONG, K_UINT, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, K_UINT, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_DOUBLE, K_UINT, 10),
    Q(CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF, K_UINT, 11),
    Q(CL_DEVICE_NATIVE_VECTOR_WIDTH_CHAR, K_UINT, 11),
    Q(CL_DEVICE_NATIVE_VECTOR_WIDTH_INT, K_UINT, 11),
    Q(CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, K_UINT, 11),
    Q(CL_DEVICE_MAX_CLOCK_FREQUENCY, K_UINT, 10),
    Q(CL_DEVICE_ADDRESS_BITS, K_UINT, 10),
    Q(CL_DEVICE_MAX_MEM_ALLOC_SIZE, K_ULONG, 10),
    Q(CL_DEVICE_IMAGE_SUPPORT, K_BOOL, 10),
    Q(CL_DEVICE_MAX_READ_IMAGE_ARGS, K_UINT, 10),
    Q(CL_DEVICE_MAX_WRITE_IMAGE_ARGS, K_UINT, 10),
    Q(CL_DEVICE_IMAGE2D_MAX_WIDTH, K_SIZE, 10),
    Q(CL_DEVICE_IMAGE2D_MAX_HEIGHT, K_SIZE, 10),
    Q(CL_DEVICE_IMAGE3D_MAX_WIDTH, K_SIZE, 10),
    Q(CL_DEVICE_IMAGE3D_MAX_HEIGHT, K_SIZE, 10),
    Q(CL_DEVICE_IMAGE3D_MAX_DEPTH, K_SIZE, 10),
    Q(CL_DEVICE_IMAGE_MAX_BUFFER_SIZE, K_SIZE, 12),
    Q(CL_DEVICE_IMAGE_MAX_ARRAY_SIZE, K_SIZE, 12),
    Q(CL_DEVICE_MAX_SAMPLERS, K_UINT, 10),
    Q(CL_DEVICE_MAX_PARAMETER_SIZE, K_SIZE, 10),
    Q(CL_DEVICE_MEM_BASE_ADDR_ALIGN, K_UINT, 10),
    Q(CL_DEVICE_SINGLE_FP_CONFIG, K_BITS, 10),
    Q(CL_DEVICE_DOUBLE_FP_CONFIG, K_BITS, 12),
    Q(CL_DEVICE_GLOBAL_MEM_CACHE_TYPE, K_UINT, 10),
    Q(CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE, K_UINT, 10),
    Q(CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, K_ULONG, 10),
    Q(CL_DEVICE_GLOBAL_MEM_SIZE, K_ULONG, 10),
    Q(CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE, K_ULONG, 10),
    Q(CL_DEVICE_MAX_CONSTANT_ARGS, K_UINT, 10),
    Q(CL_DEVICE_LOCAL_MEM_TYPE, K_UINT, 10),
    Q(CL_DEVICE_LOCAL_MEM_SIZE, K_ULONG, 10),
    Q(CL_DEVICE_ERROR_CORRECTION_SUPPORT, K_BOOL, 10),
    Q(CL_DEVICE_PROFILING_TIMER_RESOLUTION, K_SIZE, 10),
    Q(CL_DEVICE_ENDIAN_LITTLE, K_BOOL, 10),
    Q(CL_DEVICE_AVAILABLE, K_BOOL, 10),
    Q(CL_DEVICE_COMPILER_AVAILABLE, K_BOOL, 10),
    Q(CL_DEVICE_LINKER_AVAILABLE, K_BOOL, 12),
    Q(CL_DEVICE_EXECUTION_CAPABILITIES, K_BITS, 10),
    Q(CL_DEVICE_QUEUE_PROPERTIES, K_BITS, 10),
    Q(CL_DEVICE_PLATFORM, K_PTR, 10),
    Q(CL_DEVICE_NAME, K_STR, 10),
    Q(CL_DEVICE_VENDOR, K_STR, 10),
    Q(CL_DRIVER_VERSION, K_STR, 10),
    Q(CL_DEVICE_PROFILE, K_STR, 10),
    Q(CL_DEVICE_VERSION, K_STR, 10),
    Q(CL_DEVICE_OPENCL_C_VERSION, K_STR, 11),
    Q(CL_DEVICE_EXTENSIONS, K_STR, 10),
    Q(CL_DEVICE_BUILT_IN_KERNELS, K_STR, 12),
    Q(CL_DEVICE_PRINTF_BUFFER_SIZE, K_SIZE, 12),
    Q(CL_DEVICE_PREFERRED_INTEROP_USER_SYNC, K_BOOL, 12),
    Q(CL_DEVICE_PARENT_DEVICE, K_PTR, 12),
    Q(CL_DEVICE_PARTITION_MAX_SUB_DEVICES, K_UINT, 12),
    Q(CL_DEVICE_PARTITION_AFFINITY_DOMAIN, K_BITS, 12),
    Q(CL_DEVICE_REFERENCE_COUNT, K_UINT, 12),
    Q(CL_DEVICE_HOST_UNIFIED_MEMORY, K_BOOL, 11),
    Q(CL_DEVICE_MAX_READ_WRITE_IMAGE_ARGS, K_UINT, 20),
    Q(CL_DEVICE_MAX_GLOBAL_VARIABLE_SIZE, K_SIZE, 20),
    Q(CL_DEVICE_QUEUE_ON_HOST_PROPERTIES, K_BITS, 20),
    Q(CL_DEVICE_SVM_CAPABILITIES, K_BITS, 20),
    Q(CL_DEVICE_PIPE_MAX_ACTIVE_RESERVATIONS, K_UINT, 20),
    Q(CL_DEVICE_IL_VERSION, K_STR, 21),
    Q(CL_DEVICE_MAX_NUM_SUB_GROUPS, K_UINT, 21),
    Q(CL_DEVICE_NUMERIC_VERSION, K_UINT, 30),
    Q(CL_DEVICE_ATOMIC_MEMORY_CAPABILITIES, K_BITS, 30),
    Q(CL_DEVICE_ATOMIC_FENCE_CAPABILITIES, K_BITS, 30),
    Q(CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT, K_BOOL, 30),
    Q(CL_DEVICE_WORK_GROUP_COLLECTIVE_FUNCTIONS_SUPPORT, K_BOOL, 30),
    Q(CL_DEVICE_GENERIC_ADDRESS_SPACE_SUPPORT, K_BOOL, 30),
    Q(CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES, K_BITS, 30),
    Q(CL_DEVICE_PIPE_SUPPORT, K_BOOL, 30),
    Q(CL_DEVICE_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, K_SIZE, 30),
    Q(CL_DEVICE_LATEST_CONFORMANCE_VERSION_PASSED, K_STR, 30),
};

/* Queries that return arrays of variable length (possibly empty). */
static const struct q VAR_QUERIES[] = {
    Q(CL_DEVICE_PARTITION_PROPERTIES, K_ARRAY, 12),
    Q(CL_DEVICE_PARTITION_TYPE, K_ARRAY, 12),
    Q(CL_DEVICE_OPENCL_C_ALL_VERSIONS, K_ARRAY, 30),
    Q(CL_DEVICE_OPENCL_C_FEATURES, K_ARRAY, 30),
    Q(CL_DEVICE_EXTENSIONS_WITH_VERSION, K_ARRAY, 30),
    Q(CL_DEVICE_ILS_WITH_VERSION, K_ARRAY, 30),
    Q(CL_DEVICE_BUILT_IN_KERNELS_WITH_VERSION, K_ARRAY, 30),
};

static size_t expected_size(enum kind k) {
    switch (k) {
    case K_UINT: return sizeof(cl_uint);
    case K_ULONG: return sizeof(cl_ulong);
    case K_SIZE: return sizeof(size_t);
    case K_BOOL: return sizeof(cl_bool);
    case K_BITS: return sizeof(cl_bitfield);
    case K_PTR: return sizeof(void *);
    default: return 0;
    }
}

/* Runs the square kernel on device d in a fresh context; checks the result. */
static void run_square(cl_device_id d) {
    cl_context ctx = CHKE(clCreateContext(NULL, 1, &d, NULL, NULL, E));
    cl_command_queue q = CHKE(clCreateCommandQueueWithProperties(ctx, d, NULL, E));
    cl_program p = CHKE(clCreateProgramWithSource(ctx, 1, &SRC, NULL, E));
    CHECK(clBuildProgram(p, 1, &d, "", NULL, NULL));
    cl_kernel k = CHKE(clCreateKernel(p, "sq", E));
    int a[256];
    for (int i = 0; i < 256; i++) a[i] = i - 100;
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof a, a, E));
    CHECK(clSetKernelArg(k, 0, sizeof b, &b));
    size_t gws = 256;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gws, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof a, a, 0, NULL, NULL));
    for (int i = 0; i < 256; i++) REQUIRE(a[i] == (i - 100) * (i - 100), "a[%d]=%d", i, a[i]);
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(p));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
}

static void check_platform(void) {
    static const cl_platform_info infos[] = {CL_PLATFORM_PROFILE, CL_PLATFORM_VERSION,
                                             CL_PLATFORM_NAME, CL_PLATFORM_VENDOR,
                                             CL_PLATFORM_EXTENSIONS, CL_PLATFORM_ICD_SUFFIX_KHR};
    for (size_t i = 0; i < sizeof infos / sizeof infos[0]; i++) {
        size_t n = 0;
        CHECK(clGetPlatformInfo(g_platform, infos[i], 0, NULL, &n));
        REQUIRE(n >= 1, "platform info %#x size %zu", infos[i], n);
        char *s = calloc(n, 1);
        size_t n2 = 0;
        CHECK(clGetPlatformInfo(g_platform, infos[i], n, s, &n2));
        REQUIRE(n2 == n, "size %zu then %zu", n, n2);
        REQUIRE(s[n - 1] == '\0' && strlen(s) == n - 1, "platform info %#x not a C string of "
                "size %zu", infos[i], n);
        if (infos[i] != CL_PLATFORM_EXTENSIONS) REQUIRE(strlen(s) > 0, "empty info %#x", infos[i]);
        free(s);
    }
    char *name = platform_str(g_platform, CL_PLATFORM_NAME);
    char *version = platform_str(g_platform, CL_PLATFORM_VERSION);
    char *profile = platform_str(g_platform, CL_PLATFORM_PROFILE);
    char *ext = platform_str(g_platform, CL_PLATFORM_EXTENSIONS);
    char *suffix = platform_str(g_platform, CL_PLATFORM_ICD_SUFFIX_KHR);
    const char *want = getenv("RGPU_TEST_PLATFORM");
    if (want && strcmp(want, "rgpu") == 0) REQUIRE(strcmp(name, "rgpu") == 0, "name '%s'", name);
    REQUIRE(parse_cl_version(version) >= 12, "platform version '%s'", version);
    REQUIRE(!strcmp(profile, "FULL_PROFILE") || !strcmp(profile, "EMBEDDED_PROFILE"),
            "profile '%s'", profile);
    REQUIRE(strstr(ext, "cl_khr_icd") != NULL, "platform extensions '%s' lack cl_khr_icd", ext);
    REQUIRE(strlen(suffix) > 0, "empty ICD suffix");
    /* too small a buffer, unknown param */
    char tiny[2];
    EXPECT(CL_INVALID_VALUE, clGetPlatformInfo(g_platform, CL_PLATFORM_NAME, 2, tiny, NULL));
    EXPECT(CL_INVALID_VALUE, clGetPlatformInfo(g_platform, 0x7fff, 0, NULL, &(size_t){0}));
    if (parse_cl_version(version) >= 30) {
        cl_version nv = 0;
        size_t n = 0;
        CHECK(clGetPlatformInfo(g_platform, CL_PLATFORM_NUMERIC_VERSION, sizeof nv, &nv, &n));
        REQUIRE(n == sizeof nv && CL_VERSION_MAJOR(nv) >= 3, "numeric version %#x", nv);
        CHECK(clGetPlatformInfo(g_platform, CL_PLATFORM_EXTENSIONS_WITH_VERSION, 0, NULL, &n));
        REQUIRE(n % sizeof(cl_name_version) == 0, "extensions with version size %zu", n);
        cl_ulong res = 0;
        CHECK(clGetPlatformInfo(g_platform, CL_PLATFORM_HOST_TIMER_RESOLUTION, sizeof res, &res,
                                NULL));
    }
    /* clGetPlatformIDs contract */
    cl_uint np = 0;
    CHECK(clGetPlatformIDs(0, NULL, &np));
    REQUIRE(np >= 1, "%u platforms", np);
    EXPECT(CL_INVALID_VALUE, clGetPlatformIDs(0, (cl_platform_id[1]){0}, NULL));
    EXPECT(CL_INVALID_VALUE, clGetPlatformIDs(0, NULL, NULL));
    free(name); free(version); free(profile); free(ext); free(suffix);
}

static void check_device_ids(void) {
    cl_uint n_all = 0;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n_all));
    REQUIRE(n_all >= 1, "%u devices", n_all);
    cl_device_id *all = calloc(n_all, sizeof *all);
    cl_uint got = 0;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, n_all, all, &got));
    REQUIRE(got == n_all, "%u then %u devices", n_all, got);
    for (cl_uint i = 0; i < n_all; i++) {
        REQUIRE(all[i] != NULL, "device %u NULL", i);
        for (cl_uint j = 0; j < i; j++) REQUIRE(all[i] != all[j], "duplicate device %u", i);
    }
    /* Asking again returns the same handles. */
    cl_device_id first = NULL;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 1, &first, NULL));
    REQUIRE(first == all[0], "device handles not stable");

    cl_uint n_def = 0;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_DEFAULT, 0, NULL, &n_def));
    REQUIRE(n_def >= 1 && n_def <= n_all, "%u default devices", n_def);
    cl_device_id def = NULL;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_DEFAULT, 1, &def, NULL));
    int def_found = 0;
    for (cl_uint i = 0; i < n_all; i++) def_found |= all[i] == def;
    REQUIRE(def_found, "default device not among ALL devices");

    static const cl_device_type types[] = {CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
                                           CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_CUSTOM};
    for (size_t t = 0; t < 4; t++) {
        cl_uint expect = 0;
        for (cl_uint i = 0; i < n_all; i++) {
            cl_device_type ty = 0;
            CHECK(clGetDeviceInfo(all[i], CL_DEVICE_TYPE, sizeof ty, &ty, NULL));
            if (ty & types[t]) expect++;
        }
        cl_uint n = 0;
        cl_int err = clGetDeviceIDs(g_platform, types[t], 0, NULL, &n);
        if (expect == 0) {
            REQUIRE(err == CL_DEVICE_NOT_FOUND, "type %#lx: expected CL_DEVICE_NOT_FOUND, got %d "
                    "(%s)", (unsigned long)types[t], err, cl_err_name(err));
        } else {
            REQUIRE(err == CL_SUCCESS && n == expect, "type %#lx: err %d n %u expected %u",
                    (unsigned long)types[t], err, n, expect);
            cl_device_id *ds = calloc(n, sizeof *ds);
            CHECK(clGetDeviceIDs(g_platform, types[t], n, ds, NULL));
            for (cl_uint i = 0; i < n; i++) {
                cl_device_type ty = 0;
                CHECK(clGetDeviceInfo(ds[i], CL_DEVICE_TYPE, sizeof ty, &ty, NULL));
                REQUIRE(ty & types[t], "device of wrong type %#lx", (unsigned long)ty);
            }
            free(ds);
        }
    }
    EXPECT(CL_INVALID_VALUE, clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 0, all, NULL));
    EXPECT(CL_INVALID_VALUE, clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 0, NULL, NULL));
    /* The spec says CL_INVALID_DEVICE_TYPE; PoCL answers CL_DEVICE_NOT_FOUND. */
    cl_int e = clGetDeviceIDs(g_platform, (cl_device_type)1 << 40, 1, all, NULL);
    REQUIRE(e == CL_INVALID_DEVICE_TYPE || e == CL_DEVICE_NOT_FOUND, "bogus type: %d (%s)", e,
            cl_err_name(e));
    free(all);
}

static void check_device_info(cl_device_id d) {
    int ver = device_version(d);
    REQUIRE(ver >= 12, "device version %d", ver);
    for (size_t i = 0; i < sizeof QUERIES / sizeof QUERIES[0]; i++) {
        const struct q *qq = &QUERIES[i];
        if (ver < qq->min_version) continue;
        size_t n = 0;
        cl_int err = clGetDeviceInfo(d, qq->param, 0, NULL, &n);
        if (err != CL_SUCCESS) t_fail(__FILE__, __LINE__, qq->name, err);
        size_t want = expected_size(qq->kind);
        /* PoCL 3.1 answers CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES with 4 bytes. */
        if (qq->param == CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES && n == 4) want = 4;
        if (want) REQUIRE(n == want, "%s: size %zu, expected %zu", qq->name, n, want);
        REQUIRE(n > 0, "%s: size 0", qq->name);
        unsigned char *buf = calloc(n + 8, 1);
        memset(buf, 0xcd, n + 8);
        size_t n2 = 0;
        err = clGetDeviceInfo(d, qq->param, n, buf, &n2);
        if (err != CL_SUCCESS) t_fail(__FILE__, __LINE__, qq->name, err);
        REQUIRE(n2 == n, "%s: size %zu then %zu", qq->name, n, n2);
        REQUIRE(buf[n] == 0xcd, "%s wrote past the size it reported", qq->name);
        if (qq->kind == K_STR) {
            REQUIRE(buf[n - 1] == 0 && strlen((char *)buf) == n - 1, "%s: not a C string",
                    qq->name);
        }
        if (qq->kind == K_BOOL) {
            cl_bool b;
            memcpy(&b, buf, sizeof b);
            REQUIRE(b == CL_TRUE || b == CL_FALSE, "%s: bool %u", qq->name, b);
        }
        /* A too small buffer is rejected. */
        if (n > 1) {
            err = clGetDeviceInfo(d, qq->param, n - 1, buf, NULL);
            REQUIRE(err == CL_INVALID_VALUE, "%s with size %zu: %d (%s), expected CL_INVALID_VALUE",
                    qq->name, n - 1, err, cl_err_name(err));
        }
        free(buf);
    }
    for (size_t i = 0; i < sizeof VAR_QUERIES / sizeof VAR_QUERIES[0]; i++) {
        const struct q *qq = &VAR_QUERIES[i];
        if (ver < qq->min_version) continue;
        size_t n = 0;
        cl_int err = clGetDeviceInfo(d, qq->param, 0, NULL, &n);
        if (err != CL_SUCCESS) t_fail(__FILE__, __LINE__, qq->name, err);
        if (n) {
            unsigned char *buf = calloc(n, 1);
            size_t n2 = 0;
            err = clGetDeviceInfo(d, qq->param, n, buf, &n2);
            if (err != CL_SUCCESS) t_fail(__FILE__, __LINE__, qq->name, err);
            REQUIRE(n2 == n, "%s: size %zu then %zu", qq->name, n, n2);
            free(buf);
        }
    }

    /* Sane values. */
    cl_platform_id plat = NULL;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL));
    REQUIRE(plat == g_platform, "CL_DEVICE_PLATFORM %p, selected platform %p", (void *)plat,
            (void *)g_platform);
    REQUIRE(device_uint(d, CL_DEVICE_MAX_COMPUTE_UNITS) >= 1, "compute units");
    cl_uint dims = device_uint(d, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS);
    REQUIRE(dims >= 3, "work item dims %u", dims);
    size_t *sizes = calloc(dims, sizeof *sizes);
    size_t n = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, dims * sizeof *sizes, sizes, &n));
    REQUIRE(n == dims * sizeof(size_t), "work item sizes size %zu", n);
    for (cl_uint i = 0; i < dims; i++) REQUIRE(sizes[i] >= 1, "work item size[%u]=%zu", i, sizes[i]);
    size_t wg = device_size(d, CL_DEVICE_MAX_WORK_GROUP_SIZE);
    REQUIRE(wg >= 1 && sizes[0] <= wg * 1024, "max work group size %zu", wg);
    free(sizes);
    cl_ulong gmem = device_ulong(d, CL_DEVICE_GLOBAL_MEM_SIZE);
    cl_ulong alloc = device_ulong(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    REQUIRE(gmem > 0 && alloc > 0 && alloc <= gmem, "global %llu alloc %llu",
            (unsigned long long)gmem, (unsigned long long)alloc);
    REQUIRE(device_ulong(d, CL_DEVICE_LOCAL_MEM_SIZE) > 0, "local mem size");
    REQUIRE(device_size(d, CL_DEVICE_MAX_PARAMETER_SIZE) >= 256, "max parameter size");
    cl_uint align = device_uint(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN);
    REQUIRE(align >= 8 && (align & (align - 1)) == 0, "base addr align %u bits", align);
    cl_uint bits = device_uint(d, CL_DEVICE_ADDRESS_BITS);
    REQUIRE(bits == 32 || bits == 64, "address bits %u", bits);
    cl_bool avail = 0, comp = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_AVAILABLE, sizeof avail, &avail, NULL));
    CHECK(clGetDeviceInfo(d, CL_DEVICE_COMPILER_AVAILABLE, sizeof comp, &comp, NULL));
    REQUIRE(avail && comp, "available %u compiler %u", avail, comp);
    cl_device_type ty = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof ty, &ty, NULL));
    REQUIRE(ty & (CL_DEVICE_TYPE_CPU | CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR |
                  CL_DEVICE_TYPE_CUSTOM), "device type %#lx", (unsigned long)ty);
    cl_command_queue_properties qp = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_QUEUE_PROPERTIES, sizeof qp, &qp, NULL));
    REQUIRE(qp & CL_QUEUE_PROFILING_ENABLE, "queue properties %#lx lack profiling",
            (unsigned long)qp);
    char *dv = device_str(d, CL_DEVICE_VERSION);
    REQUIRE(strncmp(dv, "OpenCL ", 7) == 0, "device version '%s'", dv);
    char *cv = device_str(d, CL_DEVICE_OPENCL_C_VERSION);
    REQUIRE(strncmp(cv, "OpenCL C ", 9) == 0, "OpenCL C version '%s'", cv);
    char *nm = device_str(d, CL_DEVICE_NAME);
    REQUIRE(strlen(nm) > 0, "empty device name");
    free(dv); free(cv); free(nm);
    cl_device_id parent = (cl_device_id)1;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_PARENT_DEVICE, sizeof parent, &parent, NULL));
    REQUIRE(parent == NULL, "root device has parent %p", (void *)parent);
    REQUIRE(device_uint(d, CL_DEVICE_REFERENCE_COUNT) == 1, "root device refcount");
    if (ver >= 30) {
        cl_version nv = device_uint(d, CL_DEVICE_NUMERIC_VERSION);
        REQUIRE((int)(CL_VERSION_MAJOR(nv) * 10 + CL_VERSION_MINOR(nv)) == ver,
                "numeric version %#x vs version %d", nv, ver);
    }

    /* Errors. */
    EXPECT(CL_INVALID_VALUE, clGetDeviceInfo(d, 0x7fff, 0, NULL, &n));
    EXPECT(CL_INVALID_DEVICE, clGetDeviceInfo(NULL, CL_DEVICE_NAME, 0, NULL, &n));

    /* Retain/release of a root device are no-ops that succeed. */
    CHECK(clRetainDevice(d));
    CHECK(clReleaseDevice(d));
    REQUIRE(device_uint(d, CL_DEVICE_REFERENCE_COUNT) == 1, "root device refcount after retain");
}

static char *check_remote_identity(cl_device_id d) {
    /* The remote device says which server holds it. */
    size_t n = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_RGPU_SERVER, 0, NULL, &n));
    REQUIRE(n > 1, "CL_DEVICE_RGPU_SERVER size %zu", n);
    char *srv = calloc(n, 1);
    CHECK(clGetDeviceInfo(d, CL_DEVICE_RGPU_SERVER, n, srv, NULL));
    REQUIRE(srv[n - 1] == 0 && strlen(srv) == n - 1, "server string not a C string");
    REQUIRE(strchr(srv, ':') != NULL, "server '%s' is not host:port", srv);
    const char *expect = getenv("RGPU_TEST_EXPECT_SERVER");
    if (expect && *expect) REQUIRE(strstr(expect, srv) != NULL, "server '%s', expected one of '%s'",
                                   srv, expect);
    REQUIRE(has_extension(d, "cl_rgpu_remote_device"), "no cl_rgpu_remote_device extension");

    /* Compare with the same device seen natively (server and client on this host). */
    if (!getenv("RGPU_TEST_NATIVE_COMPARE")) return srv;
    cl_platform_id native = find_platform(getenv("RGPU_TEST_NATIVE_COMPARE"));
    REQUIRE(native != NULL, "native platform '%s' not listed beside rgpu",
            getenv("RGPU_TEST_NATIVE_COMPARE"));
    cl_uint nd = 0;
    CHECK(clGetDeviceIDs(native, CL_DEVICE_TYPE_ALL, 0, NULL, &nd));
    cl_device_id *nds = calloc(nd, sizeof *nds);
    CHECK(clGetDeviceIDs(native, CL_DEVICE_TYPE_ALL, nd, nds, NULL));
    char *rname = device_str(d, CL_DEVICE_NAME);
    cl_device_id twin = NULL;
    for (cl_uint i = 0; i < nd && !twin; i++) {
        char *nn = device_str(nds[i], CL_DEVICE_NAME);
        if (!strcmp(nn, rname)) twin = nds[i];
        free(nn);
    }
    REQUIRE(twin != NULL, "remote device '%s' has no native twin", rname);
    static const cl_device_info same_uint[] = {
        CL_DEVICE_MAX_COMPUTE_UNITS, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, CL_DEVICE_ADDRESS_BITS,
        CL_DEVICE_MEM_BASE_ADDR_ALIGN, CL_DEVICE_VENDOR_ID, CL_DEVICE_IMAGE_SUPPORT,
        CL_DEVICE_MAX_CLOCK_FREQUENCY, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT};
    for (size_t i = 0; i < sizeof same_uint / sizeof same_uint[0]; i++)
        REQUIRE(device_uint(d, same_uint[i]) == device_uint(twin, same_uint[i]),
                "info %#x: remote %u native %u", same_uint[i], device_uint(d, same_uint[i]),
                device_uint(twin, same_uint[i]));
    static const cl_device_info same_ulong[] = {CL_DEVICE_GLOBAL_MEM_SIZE,
                                                CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                                                CL_DEVICE_LOCAL_MEM_SIZE, CL_DEVICE_TYPE};
    for (size_t i = 0; i < sizeof same_ulong / sizeof same_ulong[0]; i++)
        REQUIRE(device_ulong(d, same_ulong[i]) == device_ulong(twin, same_ulong[i]),
                "info %#x differs", same_ulong[i]);
    REQUIRE(device_size(d, CL_DEVICE_MAX_WORK_GROUP_SIZE) ==
                device_size(twin, CL_DEVICE_MAX_WORK_GROUP_SIZE), "max work group size differs");
    static const cl_device_info same_str[] = {CL_DEVICE_VENDOR, CL_DEVICE_VERSION,
                                              CL_DRIVER_VERSION, CL_DEVICE_OPENCL_C_VERSION,
                                              CL_DEVICE_PROFILE};
    for (size_t i = 0; i < sizeof same_str / sizeof same_str[0]; i++) {
        char *a = device_str(d, same_str[i]), *b = device_str(twin, same_str[i]);
        REQUIRE(!strcmp(a, b), "info %#x: remote '%s' native '%s'", same_str[i], a, b);
        free(a); free(b);
    }
    /* Remote extensions are native ones (a remote platform may leave out extensions whose host
     * API it does not forward), and the kernel-language ones are all kept. */
    char *next = device_str(twin, CL_DEVICE_EXTENSIONS);
    char *rext = device_str(d, CL_DEVICE_EXTENSIONS);
    for (char *tok = strtok(rext, " "); tok; tok = strtok(NULL, " "))
        REQUIRE(!strcmp(tok, "cl_rgpu_remote_device") || has_extension(twin, tok),
                "remote device lists extension %s that the native device lacks", tok);
    static const char *kernel_exts[] = {
        "cl_khr_fp64", "cl_khr_fp16", "cl_khr_byte_addressable_store", "cl_khr_3d_image_writes",
        "cl_khr_global_int32_base_atomics", "cl_khr_global_int32_extended_atomics",
        "cl_khr_local_int32_base_atomics", "cl_khr_local_int32_extended_atomics",
        "cl_khr_int64_base_atomics", "cl_khr_int64_extended_atomics"};
    for (size_t i = 0; i < sizeof kernel_exts / sizeof kernel_exts[0]; i++)
        if (has_extension(twin, kernel_exts[i]))
            REQUIRE(has_extension(d, kernel_exts[i]), "remote device lacks native extension %s",
                    kernel_exts[i]);
    free(rext);
    free(next); free(rname); free(nds);
    return srv;
}

static void check_sub_devices(cl_device_id d) {
    size_t n = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_PARTITION_PROPERTIES, 0, NULL, &n));
    cl_device_partition_property pp[16] = {0};
    if (n) CHECK(clGetDeviceInfo(d, CL_DEVICE_PARTITION_PROPERTIES, sizeof pp, pp, NULL));
    int equally = 0;
    for (size_t i = 0; i < n / sizeof pp[0]; i++) equally |= pp[i] == CL_DEVICE_PARTITION_EQUALLY;
    cl_uint cus = device_uint(d, CL_DEVICE_MAX_COMPUTE_UNITS);
    cl_uint maxsub = device_uint(d, CL_DEVICE_PARTITION_MAX_SUB_DEVICES);

    cl_device_partition_property props[] = {CL_DEVICE_PARTITION_EQUALLY, 1, 0};
    cl_uint nsub = 0;
    cl_int err = clCreateSubDevices(d, props, 0, NULL, &nsub);
    if (err != CL_SUCCESS) {
        REQUIRE(err < 0, "clCreateSubDevices returned %d", err);
        NOTE("clCreateSubDevices(EQUALLY,1) -> %d (%s); partition by equally listed: %d",
             err, cl_err_name(err), equally);
        return;
    }
    REQUIRE(nsub >= 1, "%u sub-devices", nsub);
    if (equally && cus >= 2 && maxsub >= 2) REQUIRE(nsub >= 2, "%u sub-devices of %u CUs", nsub, cus);
    cl_device_id *subs = calloc(nsub, sizeof *subs);
    cl_uint nsub2 = 0;
    CHECK(clCreateSubDevices(d, props, nsub, subs, &nsub2));
    REQUIRE(nsub2 == nsub, "%u then %u sub-devices", nsub, nsub2);
    for (cl_uint i = 0; i < nsub; i++) {
        cl_device_id parent = NULL;
        CHECK(clGetDeviceInfo(subs[i], CL_DEVICE_PARENT_DEVICE, sizeof parent, &parent, NULL));
        REQUIRE(parent == d, "sub-device parent %p, expected %p", (void *)parent, (void *)d);
        REQUIRE(device_uint(subs[i], CL_DEVICE_MAX_COMPUTE_UNITS) == 1, "sub-device CUs");
        cl_device_partition_property pt[4] = {0};
        CHECK(clGetDeviceInfo(subs[i], CL_DEVICE_PARTITION_TYPE, sizeof pt, pt, &n));
        REQUIRE(n >= sizeof pt[0] && pt[0] == CL_DEVICE_PARTITION_EQUALLY,
                "partition type size %zu first %ld", n, (long)pt[0]);
        cl_platform_id plat = NULL;
        CHECK(clGetDeviceInfo(subs[i], CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL));
        REQUIRE(plat == g_platform, "sub-device platform");
        REQUIRE(device_uint(subs[i], CL_DEVICE_REFERENCE_COUNT) == 1, "sub-device refcount");
        CHECK(clRetainDevice(subs[i]));
        REQUIRE(device_uint(subs[i], CL_DEVICE_REFERENCE_COUNT) == 2, "refcount after retain");
        CHECK(clReleaseDevice(subs[i]));
        REQUIRE(device_uint(subs[i], CL_DEVICE_REFERENCE_COUNT) == 1, "refcount after release");
    }
    run_square(subs[0]);
    for (cl_uint i = 0; i < nsub; i++) CHECK(clReleaseDevice(subs[i]));
    free(subs);
    /* A bad partition request fails. */
    cl_device_partition_property bad[] = {CL_DEVICE_PARTITION_EQUALLY, (cl_device_partition_property)
                                          (cus + 1000), 0};
    EXPECT_FAIL(clCreateSubDevices(d, bad, 0, NULL, &nsub));
}

/* Answers consistent with the device's and platform's own claims (Khronos CTS test_api and
 * test_computeinfo found these through rgpu): they hold on any implementation. */
static void check_consistency(cl_device_id d) {
    char *version = platform_str(g_platform, CL_PLATFORM_VERSION);
    int v30 = parse_cl_version(version) >= 30;
    free(version);
    /* A platform without a host timer (resolution 0) has no clGetHostTimer. */
    cl_ulong resolution = 1;
    if (v30 && clGetPlatformInfo(g_platform, CL_PLATFORM_HOST_TIMER_RESOLUTION, sizeof resolution,
                                 &resolution, NULL) == CL_SUCCESS && resolution == 0) {
        cl_ulong t = 0;
        EXPECT(CL_INVALID_OPERATION, clGetHostTimer(d, &t));
    }
    /* Every extension is listed with its version too, and only those. */
    if (v30) {
        size_t n = 0;
        CHECK(clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS_WITH_VERSION, 0, NULL, &n));
        cl_name_version *nv = malloc(n + 1);
        CHECK(clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS_WITH_VERSION, n, nv, NULL));
        size_t count = n / sizeof *nv;
        char *ext = NULL;
        size_t len = 0;
        CHECK(clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &len));
        ext = malloc(len + 1);
        CHECK(clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, len, ext, NULL));
        size_t words = 0;
        for (char *tok = strtok(ext, " "); tok; tok = strtok(NULL, " ")) {
            words++;
            int found = 0;
            for (size_t i = 0; i < count; i++) found |= !strcmp(nv[i].name, tok);
            REQUIRE(found, "extension %s is not in CL_DEVICE_EXTENSIONS_WITH_VERSION", tok);
        }
        REQUIRE(words == count, "%zu extensions, %zu with versions", words, count);
        free(ext);
        free(nv);
    }
    /* A device without SVM answers SVM execution info with CL_INVALID_OPERATION, whatever the
     * value; no memory object of a device without pipes is a pipe. */
    cl_device_svm_capabilities svm = 0;
    cl_bool pipes = CL_FALSE;
    if (v30) {
        CHECK(clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, NULL));
        CHECK(clGetDeviceInfo(d, CL_DEVICE_PIPE_SUPPORT, sizeof pipes, &pipes, NULL));
    }
    if (v30 && (svm == 0 || !pipes)) {
        cl_int err;
        cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
        CHECK(err);
        cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
        CHECK(err);
        CHECK(clBuildProgram(p, 1, &d, "", NULL, NULL));
        cl_kernel k = clCreateKernel(p, "sq", &err);
        CHECK(err);
        if (svm == 0)
            EXPECT(CL_INVALID_OPERATION,
                   clSetKernelExecInfo(k, CL_KERNEL_EXEC_INFO_SVM_PTRS, 0, NULL));
        cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
        CHECK(err);
        cl_uint packets = 0;
        if (!pipes)
            EXPECT(CL_INVALID_MEM_OBJECT,
                   clGetPipeInfo(b, CL_PIPE_MAX_PACKETS, sizeof packets, &packets, NULL));
        CHECK(clReleaseMemObject(b));
        CHECK(clReleaseKernel(k));
        CHECK(clReleaseProgram(p));
        CHECK(clReleaseContext(ctx));
    }
    /* Through rgpu, native kernels (host functions) are not offered: they cannot run on the
     * server's machine. */
    if (g_remote) {
        cl_device_exec_capabilities caps = 0;
        CHECK(clGetDeviceInfo(d, CL_DEVICE_EXECUTION_CAPABILITIES, sizeof caps, &caps, NULL));
        REQUIRE(!(caps & CL_EXEC_NATIVE_KERNEL), "native kernels advertised: %#lx",
                (unsigned long)caps);
    }
}

int main(void) {
    select_device();
    check_platform();
    check_device_ids();
    cl_uint nd = 0;
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 0, NULL, &nd));
    cl_device_id *ds = calloc(nd, sizeof *ds);
    CHECK(clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, nd, ds, NULL));
    char **servers = calloc(nd, sizeof *servers);
    for (cl_uint i = 0; i < nd; i++) {
        check_device_info(ds[i]);
        check_consistency(ds[i]);
        if (g_remote) servers[i] = check_remote_identity(ds[i]);
        run_square(ds[i]);
    }
    /* Every server named in RGPU_TEST_EXPECT_SERVER holds one of the devices. */
    const char *expect = getenv("RGPU_TEST_EXPECT_SERVER");
    if (g_remote && expect && *expect) {
        char *list = strdup(expect);
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            int found = 0;
            for (cl_uint i = 0; i < nd; i++) found |= !strcmp(servers[i], tok);
            REQUIRE(found, "no device reports server '%s' (of %u devices)", tok, nd);
        }
        free(list);
    }
    for (cl_uint i = 0; i < nd; i++) free(servers[i]);
    free(servers);
    check_sub_devices(g_device);
    free(ds);
    pass("platform_device");
    return 0;
}
