/* Programs: build from source with options (-D, -cl-std, -I), build failures and logs, program
 * info, binaries, compile with embedded headers + link, libraries, kernels in program, IL,
 * build callbacks, retain/release. */
#include <sys/stat.h>
#include "common.h"

static cl_context ctx;
static cl_command_queue q;

/* Runs kernel `name` of p as out[i] = f(i) over n items; returns a malloc'd result. */
static cl_int *run_gen(cl_program p, const char *name, size_t n) {
    cl_kernel k = CHKE(clCreateKernel(p, name, E));
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, n * sizeof(cl_int), NULL, E));
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
    cl_int *r = malloc(n * sizeof *r);
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, n * sizeof *r, r, 0, NULL, NULL));
    CHECK(clReleaseMemObject(out));
    CHECK(clReleaseKernel(k));
    return r;
}

static char *prog_build_str(cl_program p, cl_program_build_info what) {
    size_t n = 0;
    CHECK(clGetProgramBuildInfo(p, g_device, what, 0, NULL, &n));
    REQUIRE(n >= 1, "build info %#x size %zu", what, n);
    char *s = calloc(n + 1, 1);
    CHECK(clGetProgramBuildInfo(p, g_device, what, n, s, NULL));
    REQUIRE(s[n - 1] == 0, "build info %#x not NUL-terminated", what);
    return s;
}

static char *prog_str(cl_program p, cl_program_info what) {
    size_t n = 0;
    CHECK(clGetProgramInfo(p, what, 0, NULL, &n));
    char *s = calloc(n + 1, 1);
    if (n) CHECK(clGetProgramInfo(p, what, n, s, NULL));
    return s;
}

static cl_uint prog_refcount(cl_program p) {
    cl_uint r = 0;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_REFERENCE_COUNT, sizeof r, &r, NULL));
    return r;
}

static const char *OPT_SRC =
    "#include \"rgpu_inc.h\"\n"
    "__kernel void gen(__global int *out) {\n"
    "  int i = get_global_id(0);\n"
    "  out[i] = i * SCALE + VALUE + INC_OFFSET;\n"
    "}\n"
    "__kernel void other(__global int *out) { out[get_global_id(0)] = -1; }\n";

static void test_build_options(void) {
    /* A header in an include directory named with -I. */
    char dir[] = "/tmp/rgpu-inc-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL, "mkdtemp");
    char hpath[128];
    snprintf(hpath, sizeof hpath, "%s/rgpu_inc.h", dir);
    FILE *f = fopen(hpath, "w");
    REQUIRE(f != NULL, "cannot write %s", hpath);
    fputs("#define INC_OFFSET 11000\n", f);
    fclose(f);
    char opts[256];
    snprintf(opts, sizeof opts, "-DVALUE=7 -D SCALE=3 -cl-std=CL1.2 -I%s", dir);
    cl_program p = CHKE(clCreateProgramWithSource(ctx, 1, &OPT_SRC, NULL, E));
    cl_build_status bs = 99;
    CHECK(clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    REQUIRE(bs == CL_BUILD_NONE, "status before build %d", bs);
    EXPECT(CL_INVALID_PROGRAM_EXECUTABLE, clGetProgramInfo(p, CL_PROGRAM_NUM_KERNELS,
                                                           sizeof(size_t), &(size_t){0}, NULL));
    EXPECTE(CL_INVALID_PROGRAM_EXECUTABLE, clCreateKernel(p, "gen", E));
    CHECK(clBuildProgram(p, 1, &g_device, opts, NULL, NULL));
    unlink(hpath);
    rmdir(dir);
    CHECK(clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    REQUIRE(bs == CL_BUILD_SUCCESS, "build status %d", bs);
    /* The options exactly as given (rgpu's server adds -cl-kernel-arg-info to its build; the
     * program's own options do not show it). */
    char *o = prog_build_str(p, CL_PROGRAM_BUILD_OPTIONS);
    REQUIRE(!strcmp(o, opts), "build options '%s', given '%s'", o, opts);
    free(o);
    free(prog_build_str(p, CL_PROGRAM_BUILD_LOG));
    cl_program_binary_type bt = 0;
    CHECK(clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
    REQUIRE(bt == CL_PROGRAM_BINARY_TYPE_EXECUTABLE, "binary type %#x", bt);
    cl_int *r = run_gen(p, "gen", 1000);
    for (int i = 0; i < 1000; i++)
        REQUIRE(r[i] == i * 3 + 7 + 11000, "gen[%d] = %d expected %d", i, r[i], i * 3 + 7 + 11000);
    free(r);

    /* Program info. */
    cl_uint nd = 0;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_NUM_DEVICES, sizeof nd, &nd, NULL));
    REQUIRE(nd == 1, "num devices %u", nd);
    cl_device_id d = NULL;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_DEVICES, sizeof d, &d, NULL));
    REQUIRE(d == g_device, "program device");
    cl_context c = NULL;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_CONTEXT, sizeof c, &c, NULL));
    REQUIRE(c == ctx, "program context");
    char *src = prog_str(p, CL_PROGRAM_SOURCE);
    REQUIRE(!strcmp(src, OPT_SRC), "CL_PROGRAM_SOURCE differs: '%s'", src);
    free(src);
    size_t nk = 0;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL));
    REQUIRE(nk == 2, "num kernels %zu", nk);
    char *names = prog_str(p, CL_PROGRAM_KERNEL_NAMES);
    REQUIRE(!strcmp(names, "gen;other") || !strcmp(names, "other;gen"), "kernel names '%s'", names);
    free(names);
    cl_kernel ks[4] = {0};
    cl_uint nks = 0;
    CHECK(clCreateKernelsInProgram(p, 0, NULL, &nks));
    REQUIRE(nks == 2, "clCreateKernelsInProgram count %u", nks);
    CHECK(clCreateKernelsInProgram(p, 4, ks, &nks));
    int seen_gen = 0, seen_other = 0;
    for (cl_uint i = 0; i < nks; i++) {
        char fn[64] = {0};
        CHECK(clGetKernelInfo(ks[i], CL_KERNEL_FUNCTION_NAME, sizeof fn, fn, NULL));
        seen_gen |= !strcmp(fn, "gen");
        seen_other |= !strcmp(fn, "other");
    }
    REQUIRE(seen_gen && seen_other, "kernels created in program");
    /* Kernels made by clCreateKernelsInProgram run. */
    for (cl_uint i = 0; i < nks; i++) {
        char fn[64] = {0};
        CHECK(clGetKernelInfo(ks[i], CL_KERNEL_FUNCTION_NAME, sizeof fn, fn, NULL));
        cl_mem out = CHKE(clCreateBuffer(ctx, 0, 4 * sizeof(cl_int), NULL, E));
        CHECK(clSetKernelArg(ks[i], 0, sizeof out, &out));
        size_t g = 4;
        CHECK(clEnqueueNDRangeKernel(q, ks[i], 1, NULL, &g, NULL, 0, NULL, NULL));
        cl_int v[4];
        CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof v, v, 0, NULL, NULL));
        for (int j = 0; j < 4; j++) {
            cl_int want = !strcmp(fn, "gen") ? j * 3 + 7 + 11000 : -1;
            REQUIRE(v[j] == want, "%s[%d] = %d expected %d", fn, j, v[j], want);
        }
        CHECK(clReleaseMemObject(out));
        CHECK(clReleaseKernel(ks[i]));
    }
    EXPECT(CL_INVALID_VALUE, clCreateKernelsInProgram(p, 1, ks, NULL));

    /* Retain / release. */
    REQUIRE(prog_refcount(p) == 1, "refcount %u", prog_refcount(p));
    CHECK(clRetainProgram(p));
    REQUIRE(prog_refcount(p) == 2, "refcount after retain %u", prog_refcount(p));
    CHECK(clReleaseProgram(p));
    REQUIRE(prog_refcount(p) == 1, "refcount after release %u", prog_refcount(p));

    /* Binaries: sizes, contents, and a program created from them runs. */
    size_t bsz = 0;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof bsz, &bsz, NULL));
    REQUIRE(bsz > 0, "binary size 0");
    unsigned char *bin = malloc(bsz);
    unsigned char *bins[1] = {bin};
    CHECK(clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL));
    cl_int bstatus = -9999;
    const unsigned char *cbins[1] = {bin};
    cl_program pb = CHKE(clCreateProgramWithBinary(ctx, 1, &g_device, &bsz, cbins, &bstatus, E));
    REQUIRE(bstatus == CL_SUCCESS, "binary status %d", bstatus);
    CHECK(clBuildProgram(pb, 1, &g_device, "", NULL, NULL));
    r = run_gen(pb, "gen", 500);
    for (int i = 0; i < 500; i++)
        REQUIRE(r[i] == i * 3 + 7 + 11000, "from binary gen[%d] = %d", i, r[i]);
    free(r);
    size_t bsz2 = 0;
    CHECK(clGetProgramInfo(pb, CL_PROGRAM_BINARY_SIZES, sizeof bsz2, &bsz2, NULL));
    REQUIRE(bsz2 > 0, "binary size of binary program");
    char *bsrc = prog_str(pb, CL_PROGRAM_SOURCE);
    /* Spec: "a null string or the appropriate program source code". */
    REQUIRE(bsrc[0] == 0 || !strcmp(bsrc, OPT_SRC), "binary program has source '%s'", bsrc);
    free(bsrc);
    CHECK(clReleaseProgram(pb));
    /* A garbage binary is rejected. */
    memset(bin, 0xa5, bsz > 64 ? 64 : bsz);
    size_t gsz = bsz > 64 ? 64 : bsz;
    bstatus = -9999;
    t_err_ = -9999;
    pb = clCreateProgramWithBinary(ctx, 1, &g_device, &gsz, cbins, &bstatus, E);
    if (t_err_ == CL_SUCCESS) {
        /* some implementations only notice at build time */
        EXPECT_FAIL(clBuildProgram(pb, 1, &g_device, "", NULL, NULL));
        CHECK(clReleaseProgram(pb));
    } else {
        REQUIRE(t_err_ == CL_INVALID_BINARY && pb == NULL, "garbage binary: %d (%s)", t_err_,
                cl_err_name(t_err_));
    }
    free(bin);
    size_t zero = 0;
    EXPECTE(CL_INVALID_VALUE, clCreateProgramWithBinary(ctx, 1, &g_device, &zero, cbins, NULL, E));
    CHECK(clReleaseProgram(p));
}

static void test_build_failure(void) {
    const char *bad = "__kernel void broken(__global int *out) {\n  out[0] = undefined_symbol + ;\n}\n";
    cl_program p = CHKE(clCreateProgramWithSource(ctx, 1, &bad, NULL, E));
    EXPECT(CL_BUILD_PROGRAM_FAILURE, clBuildProgram(p, 1, &g_device, "", NULL, NULL));
    cl_build_status bs = 99;
    CHECK(clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    REQUIRE(bs == CL_BUILD_ERROR, "build status %d", bs);
    char *log = prog_build_str(p, CL_PROGRAM_BUILD_LOG);
    REQUIRE(strlen(log) > 0, "empty build log after failure");
    REQUIRE(strstr(log, "undefined_symbol") || strstr(log, "error"), "build log lacks the error: '%s'",
            log);
    free(log);
    EXPECTE(CL_INVALID_PROGRAM_EXECUTABLE, clCreateKernel(p, "broken", E));
    /* (clGetProgramBuildInfo with a NULL device crashes PoCL 3.1, so it is not tried.) */
    CHECK(clReleaseProgram(p));

    /* An invalid build option. */
    const char *ok = "__kernel void k(__global int *o) { o[0] = 1; }\n";
    p = CHKE(clCreateProgramWithSource(ctx, 1, &ok, NULL, E));
    cl_int e = clBuildProgram(p, 1, &g_device, "-this-is-not-an-option", NULL, NULL);
    REQUIRE(e == CL_INVALID_BUILD_OPTIONS || e == CL_BUILD_PROGRAM_FAILURE,
            "bad option: %d (%s)", e, cl_err_name(e));
    /* The same program object builds afterwards with good options. */
    CHECK(clBuildProgram(p, 0, NULL, NULL, NULL, NULL));
    cl_int *r = run_gen(p, "k", 1);
    REQUIRE(r[0] == 1, "rebuilt program result %d", r[0]);
    free(r);
    CHECK(clReleaseProgram(p));

    /* Argument errors. */
    EXPECTE(CL_INVALID_VALUE, clCreateProgramWithSource(ctx, 0, &ok, NULL, E));
    /* (strings == NULL crashes PoCL 3.1, so it is not tried.) */
    EXPECT(CL_INVALID_PROGRAM, clBuildProgram(NULL, 0, NULL, NULL, NULL, NULL));
}

static void test_multi_string_source(void) {
    const char *parts[3] = {"__kernel void ms(__global int *out) {\n",
                            "  out[get_global_id(0)] = 42 + (int)get_global_id(0);\n}\n/*junk*/",
                            "\n"};
    size_t lens[3] = {0, strlen(parts[1]) - 8 /* drop the junk */, 0};
    cl_program p = CHKE(clCreateProgramWithSource(ctx, 3, parts, lens, E));
    char *src = prog_str(p, CL_PROGRAM_SOURCE);
    char want[512];
    snprintf(want, sizeof want, "%s%.*s%s", parts[0], (int)lens[1], parts[1], parts[2]);
    REQUIRE(!strcmp(src, want), "concatenated source '%s'", src);
    free(src);
    CHECK(clBuildProgram(p, 1, &g_device, NULL, NULL, NULL));
    cl_int *r = run_gen(p, "ms", 64);
    for (int i = 0; i < 64; i++) REQUIRE(r[i] == 42 + i, "ms[%d] = %d", i, r[i]);
    free(r);
    CHECK(clReleaseProgram(p));
}

static void test_compile_link(void) {
    const char *hdr_src = "#define EMB_FACTOR 5\nint lib_fn(int x);\n";
    const char *main_src =
        "#include \"emb/emb.h\"\n"
        "__kernel void linked(__global int *out) {\n"
        "  int i = get_global_id(0);\n"
        "  out[i] = lib_fn(i) * EMB_FACTOR;\n"
        "}\n";
    const char *lib_src = "int lib_fn(int x) { return x + 1000; }\n";
    cl_program hdr = CHKE(clCreateProgramWithSource(ctx, 1, &hdr_src, NULL, E));
    cl_program mainp = CHKE(clCreateProgramWithSource(ctx, 1, &main_src, NULL, E));
    cl_program libp = CHKE(clCreateProgramWithSource(ctx, 1, &lib_src, NULL, E));
    const char *hname = "emb/emb.h";
    cl_int err = clCompileProgram(mainp, 1, &g_device, "", 1, &hdr, &hname, NULL, NULL);
    if (err != CL_SUCCESS) {
        char *log = prog_build_str(mainp, CL_PROGRAM_BUILD_LOG);
        fprintf(stderr, "compile log:\n%s\n", log);
        t_fail(__FILE__, __LINE__, "clCompileProgram with embedded header", err);
    }
    cl_program_binary_type bt = 0;
    CHECK(clGetProgramBuildInfo(mainp, g_device, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
    REQUIRE(bt == CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT, "binary type after compile %#x", bt);
    CHECK(clCompileProgram(libp, 1, &g_device, NULL, 0, NULL, NULL, NULL, NULL));

    /* Link the two objects into an executable. */
    cl_program objs[2] = {mainp, libp};
    cl_program exe = CHKE(clLinkProgram(ctx, 1, &g_device, "", 2, objs, NULL, NULL, E));
    CHECK(clGetProgramBuildInfo(exe, g_device, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
    REQUIRE(bt == CL_PROGRAM_BINARY_TYPE_EXECUTABLE, "binary type after link %#x", bt);
    cl_int *r = run_gen(exe, "linked", 256);
    for (int i = 0; i < 256; i++)
        REQUIRE(r[i] == (i + 1000) * 5, "linked[%d] = %d expected %d", i, r[i], (i + 1000) * 5);
    free(r);
    char *names = prog_str(exe, CL_PROGRAM_KERNEL_NAMES);
    REQUIRE(!strcmp(names, "linked"), "linked kernel names '%s'", names);
    free(names);
    CHECK(clReleaseProgram(exe));

    /* Through a library. */
    t_err_ = -9999;
    cl_program lib = clLinkProgram(ctx, 1, &g_device, "-create-library", 1, &libp, NULL, NULL, E);
    if (t_err_ == CL_SUCCESS && lib) {
        CHECK(clGetProgramBuildInfo(lib, g_device, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
        REQUIRE(bt == CL_PROGRAM_BINARY_TYPE_LIBRARY, "binary type of library %#x", bt);
        cl_program objs2[2] = {mainp, lib};
        cl_program exe2 = CHKE(clLinkProgram(ctx, 1, &g_device, NULL, 2, objs2, NULL, NULL, E));
        r = run_gen(exe2, "linked", 16);
        for (int i = 0; i < 16; i++) REQUIRE(r[i] == (i + 1000) * 5, "lib-linked[%d] = %d", i, r[i]);
        free(r);
        CHECK(clReleaseProgram(exe2));
        CHECK(clReleaseProgram(lib));
    } else {
        NOTE("clLinkProgram(-create-library) -> %d (%s)", t_err_, cl_err_name(t_err_));
    }

    /* A link with an unresolved symbol fails. */
    t_err_ = -9999;
    cl_program bad = clLinkProgram(ctx, 1, &g_device, NULL, 1, &mainp, NULL, NULL, E);
    REQUIRE(t_err_ == CL_LINK_PROGRAM_FAILURE || t_err_ == CL_INVALID_OPERATION ||
                (t_err_ == CL_SUCCESS && bad != NULL),
            "link with unresolved symbol: %d (%s)", t_err_, cl_err_name(t_err_));
    if (bad) CHECK(clReleaseProgram(bad));
    /* A compile error. */
    const char *broken = "int f( { }\n";
    cl_program bp = CHKE(clCreateProgramWithSource(ctx, 1, &broken, NULL, E));
    EXPECT(CL_COMPILE_PROGRAM_FAILURE, clCompileProgram(bp, 1, &g_device, NULL, 0, NULL, NULL,
                                                        NULL, NULL));
    char *log = prog_build_str(bp, CL_PROGRAM_BUILD_LOG);
    REQUIRE(strlen(log) > 0, "empty compile log");
    free(log);
    CHECK(clReleaseProgram(bp));
    CHECK(clReleaseProgram(hdr));
    CHECK(clReleaseProgram(mainp));
    CHECK(clReleaseProgram(libp));
}

static volatile int g_cb_called;
static void CL_CALLBACK build_cb(cl_program p, void *ud) {
    (void)p;
    g_cb_called = *(int *)ud;
}

static void test_build_callback(void) {
    const char *src = "__kernel void cbk(__global int *o) { o[get_global_id(0)] = 99; }\n";
    cl_program p = CHKE(clCreateProgramWithSource(ctx, 1, &src, NULL, E));
    static int tag = 4242;
    CHECK(clBuildProgram(p, 1, &g_device, "-DUNUSED=1", build_cb, &tag));
    double t0 = now_s();
    while (!g_cb_called && now_s() - t0 < 60) sleep_ms(5);
    REQUIRE(g_cb_called == 4242, "build callback not called with its user data (%d)", g_cb_called);
    cl_build_status bs = 99;
    CHECK(clGetProgramBuildInfo(p, g_device, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    REQUIRE(bs == CL_BUILD_SUCCESS, "status after build callback %d", bs);
    cl_int *r = run_gen(p, "cbk", 8);
    for (int i = 0; i < 8; i++) REQUIRE(r[i] == 99, "cbk[%d] = %d", i, r[i]);
    free(r);
    CHECK(clReleaseProgram(p));
    CHECK(clUnloadPlatformCompiler(g_platform));
    /* The compiler is reloaded on demand. */
    p = CHKE(clCreateProgramWithSource(ctx, 1, &src, NULL, E));
    CHECK(clBuildProgram(p, 0, NULL, "-DAFTER_UNLOAD", NULL, NULL));
    r = run_gen(p, "cbk", 8);
    REQUIRE(r[7] == 99, "after unload cbk[7] = %d", r[7]);
    free(r);
    CHECK(clReleaseProgram(p));
}

static void test_il(void) {
    char *il = device_str(g_device, CL_DEVICE_IL_VERSION);
    if (device_version(g_device) < 21 || il[0] == 0) {
        /* No IL on this device: creating a program from IL is refused, never a crash. */
        static const cl_uint junk[5] = {0x07230203u, 0x00010000u, 0, 1, 0};
        t_err_ = -9999;
        cl_program p = clCreateProgramWithIL(ctx, junk, sizeof junk, E);
        REQUIRE(p == NULL && t_err_ != CL_SUCCESS, "clCreateProgramWithIL without IL support: %d",
                t_err_);
        NOTE("IL skipped: device lists no IL version (clCreateProgramWithIL -> %d %s)", t_err_,
             cl_err_name(t_err_));
    } else {
        NOTE("IL skipped: device lists IL '%s' but no SPIR-V module is bundled", il);
    }
    free(il);
}

int main(void) {
    select_device();
    ctx = make_context();
    q = make_queue(ctx, 0);
    test_build_options();
    test_build_failure();
    test_multi_string_source();
    test_compile_link();
    test_build_callback();
    test_il();
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    pass("programs");
    return 0;
}
