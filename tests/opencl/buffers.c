/* Buffers: creation flags, read/write (blocking, non-blocking, large, odd), copy, fill, rect
 * variants, sub-buffers, map/unmap, mem info, migrate, destructor callbacks, errors.
 *
 * argv[1] (optional): number of repetitions of the data-path part (used by the robustness
 * tests to run two clients at once). */
#include "common.h"

static const char *SRC =
    "__kernel void add_u32(__global uint *a, uint k) { a[get_global_id(0)] += k; }\n"
    "__kernel void sum_u8(__global const uchar *a, uint n, __global ulong *out) {\n"
    "  ulong s = 0; for (uint i = 0; i < n; i++) s += a[i] * (ulong)(i % 7 + 1); *out = s; }\n";

static cl_context ctx;
static cl_command_queue q;
static cl_program prog;
static cl_kernel k_add, k_sum;
static cl_uint base_align; /* bytes */

static void fill_pattern(unsigned char *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

static void require_same(const void *a, const void *b, size_t n, const char *what, int line) {
    if (memcmp(a, b, n) == 0) return;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    fprintf(stderr, "FAIL buffers.c:%d: %s: first difference at byte %zu of %zu: got %u expected "
            "%u\n", line, what, i, n, x[i], y[i]);
    exit(1);
}
#define SAME(a, b, n, what) require_same(a, b, n, what, __LINE__)

static void run_add(cl_mem b, size_t n_u32, cl_uint k) {
    CHECK(clSetKernelArg(k_add, 0, sizeof b, &b));
    CHECK(clSetKernelArg(k_add, 1, sizeof k, &k));
    CHECK(clEnqueueNDRangeKernel(q, k_add, 1, NULL, &n_u32, NULL, 0, NULL, NULL));
}

static cl_ulong device_weighted_sum(cl_mem b, cl_uint n) {
    cl_ulong r = 0;
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof r, NULL, E));
    CHECK(clSetKernelArg(k_sum, 0, sizeof b, &b));
    CHECK(clSetKernelArg(k_sum, 1, sizeof n, &n));
    CHECK(clSetKernelArg(k_sum, 2, sizeof out, &out));
    CHECK(clEnqueueTask(q, k_sum, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof r, &r, 0, NULL, NULL));
    CHECK(clReleaseMemObject(out));
    return r;
}

static cl_ulong host_weighted_sum(const unsigned char *a, size_t n) {
    cl_ulong s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * (cl_ulong)(i % 7 + 1);
    return s;
}

static void check_mem_info(cl_mem m, cl_mem_flags flags, size_t size, void *host_ptr,
                           cl_mem parent, size_t offset) {
    cl_mem_object_type ty = 0;
    cl_mem_flags f = 0;
    size_t sz = 0, off = 99, n = 0;
    void *hp = (void *)1;
    cl_context c = NULL;
    cl_mem assoc = (cl_mem)1;
    cl_uint rc = 0, mc = 99;
    CHECK(clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof ty, &ty, &n));
    REQUIRE(ty == CL_MEM_OBJECT_BUFFER && n == sizeof ty, "type %#x", ty);
    CHECK(clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof f, &f, NULL));
    /* A sub-buffer may also report the host-pointer flags inherited from its parent. */
    cl_mem_flags inherit = CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;
    REQUIRE(f == flags || (parent && (f & ~inherit) == flags), "flags %#lx expected %#lx",
            (unsigned long)f, (unsigned long)flags);
    CHECK(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof sz, &sz, NULL));
    REQUIRE(sz == size, "size %zu expected %zu", sz, size);
    CHECK(clGetMemObjectInfo(m, CL_MEM_HOST_PTR, sizeof hp, &hp, NULL));
    REQUIRE(hp == host_ptr, "host ptr %p expected %p", hp, host_ptr);
    CHECK(clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof c, &c, NULL));
    REQUIRE(c == ctx, "context");
    CHECK(clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL));
    REQUIRE(assoc == parent, "associated memobject %p expected %p", (void *)assoc, (void *)parent);
    CHECK(clGetMemObjectInfo(m, CL_MEM_OFFSET, sizeof off, &off, NULL));
    REQUIRE(off == offset, "offset %zu expected %zu", off, offset);
    CHECK(clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL));
    REQUIRE(rc >= 1, "refcount %u", rc);
    CHECK(clGetMemObjectInfo(m, CL_MEM_MAP_COUNT, sizeof mc, &mc, NULL));
    if (device_version(g_device) >= 20) {
        cl_bool svm = 7;
        CHECK(clGetMemObjectInfo(m, CL_MEM_USES_SVM_POINTER, sizeof svm, &svm, NULL));
        REQUIRE(svm == CL_FALSE, "uses svm pointer %u", svm);
    }
    EXPECT(CL_INVALID_VALUE, clGetMemObjectInfo(m, 0x7fff, sizeof sz, &sz, NULL));
}

/* ---- creation flags ---- */
static void test_create(void) {
    enum { N = 4096 };
    unsigned char host[N], back[N], expect[N];
    fill_pattern(host, N, 1);

    cl_mem plain = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, E));
    check_mem_info(plain, CL_MEM_READ_WRITE, N, NULL, NULL, 0);
    cl_uint rc = 0;
    CHECK(clRetainMemObject(plain));
    CHECK(clGetMemObjectInfo(plain, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL));
    REQUIRE(rc == 2, "refcount after retain %u", rc);
    CHECK(clReleaseMemObject(plain));
    CHECK(clGetMemObjectInfo(plain, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL));
    REQUIRE(rc == 1, "refcount after release %u", rc);
    CHECK(clEnqueueWriteBuffer(q, plain, CL_TRUE, 0, N, host, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, plain, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, host, N, "plain write/read");
    CHECK(clReleaseMemObject(plain));

    /* COPY_HOST_PTR: contents taken at creation, later host changes do not matter. */
    memcpy(expect, host, N);
    cl_mem copy = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR | CL_MEM_READ_ONLY, N, host, E));
    check_mem_info(copy, CL_MEM_COPY_HOST_PTR | CL_MEM_READ_ONLY, N, NULL, NULL, 0);
    memset(host, 0xee, N);
    CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, expect, N, "COPY_HOST_PTR contents");
    REQUIRE(device_weighted_sum(copy, N) == host_weighted_sum(expect, N), "kernel sum of copy");
    CHECK(clReleaseMemObject(copy));

    /* USE_HOST_PTR: the kernel's result is visible in the host memory after a map. */
    cl_uint *uh = aligned_alloc(4096, N);
    for (int i = 0; i < N / 4; i++) uh[i] = (cl_uint)i * 7u;
    cl_mem use = CHKE(clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, N, uh, E));
    check_mem_info(use, CL_MEM_USE_HOST_PTR, N, uh, NULL, 0);
    run_add(use, N / 4, 1000);
    cl_uint *m = CHKE(clEnqueueMapBuffer(q, use, CL_TRUE, CL_MAP_READ, 0, N, 0, NULL, NULL, E));
    REQUIRE(m == uh, "map of USE_HOST_PTR buffer returned %p, host ptr %p", (void *)m, (void *)uh);
    for (int i = 0; i < N / 4; i++)
        REQUIRE(uh[i] == (cl_uint)i * 7u + 1000u, "USE_HOST_PTR host[%d]=%u after map", i, uh[i]);
    CHECK(clEnqueueUnmapMemObject(q, use, m, 0, NULL, NULL));
    /* Host writes under a write mapping reach the device. */
    m = CHKE(clEnqueueMapBuffer(q, use, CL_TRUE, CL_MAP_WRITE, 64, 128, 0, NULL, NULL, E));
    REQUIRE(m == uh + 16, "offset map of USE_HOST_PTR buffer returned %p, expected %p", (void *)m,
            (void *)(uh + 16));
    for (int i = 0; i < 32; i++) m[i] = 5u;
    CHECK(clEnqueueUnmapMemObject(q, use, m, 0, NULL, NULL));
    run_add(use, N / 4, 1);
    cl_uint rb[N / 4];
    CHECK(clEnqueueReadBuffer(q, use, CL_TRUE, 0, N, rb, 0, NULL, NULL));
    for (int i = 0; i < N / 4; i++) {
        cl_uint want = (i >= 16 && i < 48) ? 6u : (cl_uint)i * 7u + 1001u;
        REQUIRE(rb[i] == want, "USE_HOST_PTR rb[%d]=%u want %u", i, rb[i], want);
    }
    CHECK(clReleaseMemObject(use));
    free(uh);

    /* ALLOC_HOST_PTR */
    cl_mem alloc = CHKE(clCreateBuffer(ctx, CL_MEM_ALLOC_HOST_PTR, N, NULL, E));
    check_mem_info(alloc, CL_MEM_ALLOC_HOST_PTR, N, NULL, NULL, 0);
    fill_pattern(host, N, 2);
    CHECK(clEnqueueWriteBuffer(q, alloc, CL_TRUE, 0, N, host, 0, NULL, NULL));
    unsigned char *am = CHKE(clEnqueueMapBuffer(q, alloc, CL_TRUE, CL_MAP_READ, 0, N, 0, NULL,
                                                NULL, E));
    SAME(am, host, N, "ALLOC_HOST_PTR map");
    CHECK(clEnqueueUnmapMemObject(q, alloc, am, 0, NULL, NULL));
    CHECK(clReleaseMemObject(alloc));

    /* ALLOC_HOST_PTR | COPY_HOST_PTR */
    cl_mem ac = CHKE(clCreateBuffer(ctx, CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR, N, host, E));
    CHECK(clEnqueueReadBuffer(q, ac, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, host, N, "ALLOC|COPY_HOST_PTR");
    CHECK(clReleaseMemObject(ac));

    /* Host access flags. */
    cl_mem hwo = CHKE(clCreateBuffer(ctx, CL_MEM_HOST_WRITE_ONLY, N, NULL, E));
    CHECK(clEnqueueWriteBuffer(q, hwo, CL_TRUE, 0, N, host, 0, NULL, NULL));
    EXPECT(CL_INVALID_OPERATION, clEnqueueReadBuffer(q, hwo, CL_TRUE, 0, N, back, 0, NULL, NULL));
    CHECK(clReleaseMemObject(hwo));
    cl_mem hro = CHKE(clCreateBuffer(ctx, CL_MEM_HOST_READ_ONLY, N, NULL, E));
    EXPECT(CL_INVALID_OPERATION, clEnqueueWriteBuffer(q, hro, CL_TRUE, 0, N, host, 0, NULL, NULL));
    CHECK(clReleaseMemObject(hro));

    /* OpenCL 3.0 clCreateBufferWithProperties */
    if (device_version(g_device) >= 30) {
        cl_mem wp = CHKE(clCreateBufferWithProperties(ctx, NULL, CL_MEM_COPY_HOST_PTR, N, host, E));
        size_t n = 99;
        CHECK(clGetMemObjectInfo(wp, CL_MEM_PROPERTIES, 0, NULL, &n));
        REQUIRE(n == 0, "CL_MEM_PROPERTIES size %zu for NULL properties", n);
        CHECK(clEnqueueReadBuffer(q, wp, CL_TRUE, 0, N, back, 0, NULL, NULL));
        SAME(back, host, N, "clCreateBufferWithProperties");
        CHECK(clReleaseMemObject(wp));
    }
}

/* ---- read/write ---- */
static void test_read_write(void) {
    /* 64 MiB blocking round trip with data check, and a kernel over it. */
    const size_t big = 64u << 20;
    unsigned char *src = malloc(big), *dst = malloc(big);
    fill_pattern(src, big, 3);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, big, NULL, E));
    double t0 = now_s();
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, big, src, 0, NULL, NULL));
    memset(dst, 0, big);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, big, dst, 0, NULL, NULL));
    double t1 = now_s();
    SAME(dst, src, big, "64 MiB blocking round trip");
    run_add(b, big / 4, 0x01010101u);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, big, dst, 0, NULL, NULL));
    for (size_t i = 0; i < big / 4; i++) {
        cl_uint s, d;
        memcpy(&s, src + 4 * i, 4);
        memcpy(&d, dst + 4 * i, 4);
        REQUIRE(d == s + 0x01010101u, "64 MiB kernel result at %zu: %#x from %#x", i, d, s);
    }
    /* 64 MiB non-blocking: write, read, wait on the read's event. */
    fill_pattern(src, big, 4);
    cl_event ew, er;
    CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, big, src, 0, NULL, &ew));
    memset(dst, 0, big);
    CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, big, dst, 1, &ew, &er));
    CHECK(clWaitForEvents(1, &er));
    cl_int st = 99;
    CHECK(clGetEventInfo(er, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    REQUIRE(st == CL_COMPLETE, "read status %d after wait", st);
    SAME(dst, src, big, "64 MiB non-blocking round trip");
    CHECK(clReleaseEvent(ew));
    CHECK(clReleaseEvent(er));
    printf("info: 64 MiB write+read %.3f s\n", t1 - t0);

    /* Odd sizes and offsets against a host model, incl. spans across chunk boundaries. */
    const size_t osz = 9u << 20;
    unsigned char *model = malloc(osz);
    fill_pattern(model, osz, 5);
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, osz, model, 0, NULL, NULL));
    static const size_t cases[][2] = {{7, 1},          {1001, 13},       {3, 4097},
                                      {0, 1},          {osz - 1, 1},     {5, (4u << 20) + 3},
                                      {(1u << 20) - 1, 2}, {123457, (1u << 20) + 1},
                                      {osz - 65537, 65537}, {1, osz - 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t off = cases[c][0], len = cases[c][1];
        fill_pattern(src, len, 100 + (uint32_t)c);
        int blocking = c % 2;
        CHECK(clEnqueueWriteBuffer(q, b, blocking, off, len, src, 0, NULL, NULL));
        memcpy(model + off, src, len);
        if (!blocking) CHECK(clFinish(q));
        /* read back a window around it */
        size_t ro = off > 3 ? off - 3 : 0;
        size_t rl = (off + len + 5 <= osz ? off + len + 5 : osz) - ro;
        memset(dst, 0xaa, rl);
        CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, ro, rl, dst, 0, NULL, NULL));
        SAME(dst, model + ro, rl, "odd-offset write/read");
    }
    /* Random mix of writes, reads and copies within the buffer. */
    for (int it = 0; it < 60; it++) {
        size_t len = 1 + rnd() % 200000;
        size_t off = rnd() % (osz - len);
        switch (rnd() % 3) {
        case 0:
            fill_pattern(src, len, 1000 + it);
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, off, len, src, 0, NULL, NULL));
            CHECK(clFinish(q)); /* host src is reused */
            memcpy(model + off, src, len);
            break;
        case 1:
            CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, off, len, dst, 0, NULL, NULL));
            SAME(dst, model + off, len, "random read");
            break;
        default: {
            size_t doff = rnd() % (osz - len);
            if ((doff < off + len) && (off < doff + len)) break; /* overlap not allowed */
            CHECK(clEnqueueCopyBuffer(q, b, b, off, doff, len, 0, NULL, NULL));
            memmove(model + doff, model + off, len);
        }
        }
    }
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, osz, dst, 0, NULL, NULL));
    SAME(dst, model, osz, "after random operations");
    /* Many small non-blocking writes in a row, then one read. */
    for (int i = 0; i < 500; i++) {
        unsigned char v = (unsigned char)(i * 37);
        CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, (size_t)i * 3, 1, &model[osz - 1 - i], 0, NULL,
                                   NULL));
        (void)v;
    }
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, 1500, dst, 0, NULL, NULL));
    for (int i = 0; i < 500; i++) model[i * 3] = model[osz - 1 - i];
    SAME(dst, model, 1500, "500 small non-blocking writes");
    free(model);
    CHECK(clReleaseMemObject(b));
    free(src);
    free(dst);
}

/* ---- copy and fill ---- */
static void test_copy_fill(void) {
    enum { N = 1 << 16 };
    unsigned char *a = malloc(N), *bb = malloc(N), *back = malloc(N), *model = malloc(N);
    fill_pattern(a, N, 6);
    fill_pattern(bb, N, 7);
    cl_mem ma = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, N, a, E));
    cl_mem mb = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, N, bb, E));
    cl_event ec;
    CHECK(clEnqueueCopyBuffer(q, ma, mb, 100, 3001, 20000, 0, NULL, &ec));
    memcpy(model, bb, N);
    memcpy(model + 3001, a + 100, 20000);
    CHECK(clEnqueueReadBuffer(q, mb, CL_TRUE, 0, N, back, 1, &ec, NULL));
    SAME(back, model, N, "copy buffer");
    cl_command_type ct = 0;
    CHECK(clGetEventInfo(ec, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_COPY_BUFFER, "command type %#x", ct);
    CHECK(clReleaseEvent(ec));
    /* Same buffer, disjoint regions; overlapping ones are an error. */
    CHECK(clEnqueueCopyBuffer(q, mb, mb, 0, 40000, 10000, 0, NULL, NULL));
    memcpy(model + 40000, model, 10000);
    CHECK(clEnqueueReadBuffer(q, mb, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, model, N, "copy within a buffer");
    EXPECT(CL_MEM_COPY_OVERLAP, clEnqueueCopyBuffer(q, mb, mb, 0, 100, 1000, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueCopyBuffer(q, ma, mb, N - 10, 0, 20, 0, NULL, NULL));

    /* Fill with every pattern size. */
    static const size_t psz[] = {1, 2, 4, 8, 16, 32, 64, 128};
    for (size_t p = 0; p < sizeof psz / sizeof psz[0]; p++) {
        unsigned char pat[128];
        for (size_t i = 0; i < psz[p]; i++) pat[i] = (unsigned char)(0x11 * (p + 1) + i * 3);
        size_t off = psz[p] * 3, len = psz[p] * (37 + p * 11);
        cl_event ef;
        CHECK(clEnqueueFillBuffer(q, mb, pat, psz[p], off, len, 0, NULL, &ef));
        for (size_t i = 0; i < len; i++) model[off + i] = pat[i % psz[p]];
        CHECK(clEnqueueReadBuffer(q, mb, CL_TRUE, 0, N, back, 1, &ef, NULL));
        SAME(back, model, N, "fill");
        CHECK(clGetEventInfo(ef, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
        REQUIRE(ct == CL_COMMAND_FILL_BUFFER, "fill command type %#x", ct);
        CHECK(clReleaseEvent(ef));
    }
    /* A large fill. */
    cl_uint word = 0xdeadbeefu;
    CHECK(clEnqueueFillBuffer(q, ma, &word, 4, 0, N, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, ma, CL_TRUE, 0, N, back, 0, NULL, NULL));
    for (size_t i = 0; i < N / 4; i++) {
        cl_uint v;
        memcpy(&v, back + 4 * i, 4);
        REQUIRE(v == word, "fill word %zu = %#x", i, v);
    }
    unsigned char pat3[3] = {1, 2, 3};
    EXPECT(CL_INVALID_VALUE, clEnqueueFillBuffer(q, ma, pat3, 3, 0, 30, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueFillBuffer(q, ma, &word, 4, 0, 30, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueFillBuffer(q, ma, &word, 4, 2, 32, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueFillBuffer(q, ma, &word, 4, N - 4, 8, 0, NULL, NULL));
    CHECK(clReleaseMemObject(ma));
    CHECK(clReleaseMemObject(mb));
    free(a); free(bb); free(back); free(model);
}

/* ---- rect variants ---- */
static void rect_model(unsigned char *dst, const size_t dorg[3], size_t drp, size_t dsp,
                       const unsigned char *src, const size_t sorg[3], size_t srp, size_t ssp,
                       const size_t reg[3]) {
    for (size_t z = 0; z < reg[2]; z++)
        for (size_t y = 0; y < reg[1]; y++)
            memcpy(dst + (dorg[2] + z) * dsp + (dorg[1] + y) * drp + dorg[0],
                   src + (sorg[2] + z) * ssp + (sorg[1] + y) * srp + sorg[0], reg[0]);
}

static void test_rect(void) {
    const size_t brp = 32, bsp = 32 * 8, bsize = bsp * 6; /* buffer: 32 x 8 x 6 bytes */
    const size_t hrp = 20, hsp = 20 * 7, hsize = hsp * 5;  /* host: 20 x 7 x 5 bytes */
    unsigned char *host = malloc(hsize), *model = malloc(bsize), *back = malloc(bsize);
    unsigned char *hback = malloc(hsize), *hmodel = malloc(hsize);
    fill_pattern(host, hsize, 8);
    fill_pattern(model, bsize, 9);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, bsize, model, E));

    size_t borg[3] = {5, 2, 1}, horg[3] = {3, 1, 2}, reg[3] = {13, 5, 3};
    CHECK(clEnqueueWriteBufferRect(q, b, CL_TRUE, borg, horg, reg, brp, bsp, hrp, hsp, host, 0,
                                   NULL, NULL));
    rect_model(model, borg, brp, bsp, host, horg, hrp, hsp, reg);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, bsize, back, 0, NULL, NULL));
    SAME(back, model, bsize, "write buffer rect");

    /* Read rect into a host box. */
    memset(hback, 0x5c, hsize);
    memset(hmodel, 0x5c, hsize);
    size_t borg2[3] = {1, 3, 2}, horg2[3] = {0, 2, 0}, reg2[3] = {17, 4, 4};
    cl_event er;
    CHECK(clEnqueueReadBufferRect(q, b, CL_FALSE, borg2, horg2, reg2, brp, bsp, hrp, hsp, hback, 0,
                                  NULL, &er));
    CHECK(clWaitForEvents(1, &er));
    CHECK(clReleaseEvent(er));
    rect_model(hmodel, horg2, hrp, hsp, model, borg2, brp, bsp, reg2);
    SAME(hback, hmodel, hsize, "read buffer rect");

    /* Default pitches (0 = tightly packed region). */
    size_t zero[3] = {0, 0, 0}, reg3[3] = {8, 3, 2};
    unsigned char packed[8 * 3 * 2];
    fill_pattern(packed, sizeof packed, 10);
    size_t borg3[3] = {16, 4, 3};
    CHECK(clEnqueueWriteBufferRect(q, b, CL_TRUE, borg3, zero, reg3, brp, bsp, 0, 0, packed, 0,
                                   NULL, NULL));
    rect_model(model, borg3, brp, bsp, packed, zero, 8, 24, reg3);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, bsize, back, 0, NULL, NULL));
    SAME(back, model, bsize, "write buffer rect with default host pitches");

    /* Copy rect between two buffers with different pitches. */
    const size_t drp = 48, dsp = 48 * 10, dsize = dsp * 4;
    unsigned char *dmodel = malloc(dsize), *dback = malloc(dsize);
    fill_pattern(dmodel, dsize, 11);
    cl_mem d = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, dsize, dmodel, E));
    size_t sorg[3] = {2, 1, 0}, dorg[3] = {30, 6, 1}, creg[3] = {15, 4, 3};
    CHECK(clEnqueueCopyBufferRect(q, b, d, sorg, dorg, creg, brp, bsp, drp, dsp, 0, NULL, NULL));
    rect_model(dmodel, dorg, drp, dsp, model, sorg, brp, bsp, creg);
    CHECK(clEnqueueReadBuffer(q, d, CL_TRUE, 0, dsize, dback, 0, NULL, NULL));
    SAME(dback, dmodel, dsize, "copy buffer rect");

    /* Out of bounds. */
    size_t far[3] = {30, 7, 5}, big[3] = {5, 5, 5};
    EXPECT(CL_INVALID_VALUE, clEnqueueReadBufferRect(q, b, CL_TRUE, far, zero, big, brp, bsp, 0, 0,
                                                     hback, 0, NULL, NULL));
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseMemObject(d));
    free(host); free(model); free(back); free(hback); free(hmodel); free(dmodel); free(dback);
}

/* ---- sub-buffers ---- */
static void test_sub_buffers(void) {
    size_t al = base_align;
    size_t psize = al * 16;
    unsigned char *model = malloc(psize), *back = malloc(psize);
    fill_pattern(model, psize, 12);
    cl_mem parent = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, psize,
                                        model, E));
    cl_buffer_region r = {al * 2, al * 4};
    cl_mem sub = CHKE(clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                                        &r, E));
    check_mem_info(sub, CL_MEM_READ_WRITE, al * 4, NULL, parent, al * 2);
    cl_uint prc = 0;
    CHECK(clGetMemObjectInfo(parent, CL_MEM_REFERENCE_COUNT, sizeof prc, &prc, NULL));

    /* Read through the sub-buffer. */
    CHECK(clEnqueueReadBuffer(q, sub, CL_TRUE, 0, al * 4, back, 0, NULL, NULL));
    SAME(back, model + al * 2, al * 4, "read through sub-buffer");
    /* Write through it, read the parent. */
    unsigned char *w = malloc(al);
    fill_pattern(w, al, 13);
    CHECK(clEnqueueWriteBuffer(q, sub, CL_TRUE, 3, al - 5, w, 0, NULL, NULL));
    memcpy(model + al * 2 + 3, w, al - 5);
    CHECK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, psize, back, 0, NULL, NULL));
    SAME(back, model, psize, "parent after write through sub-buffer");
    /* Kernel on the sub-buffer: index 0 is the sub-buffer's origin. */
    run_add(sub, al, 3u);
    for (size_t i = 0; i < al; i++) {
        cl_uint v;
        memcpy(&v, model + al * 2 + 4 * i, 4);
        v += 3u;
        memcpy(model + al * 2 + 4 * i, &v, 4);
    }
    CHECK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, psize, back, 0, NULL, NULL));
    SAME(back, model, psize, "parent after kernel on sub-buffer");
    /* Write the parent, read the sub-buffer. */
    fill_pattern(w, al, 14);
    CHECK(clEnqueueWriteBuffer(q, parent, CL_TRUE, al * 3, al, w, 0, NULL, NULL));
    memcpy(model + al * 3, w, al);
    CHECK(clEnqueueReadBuffer(q, sub, CL_TRUE, 0, al * 4, back, 0, NULL, NULL));
    SAME(back, model + al * 2, al * 4, "sub-buffer after write to parent");
    /* Map the sub-buffer. */
    unsigned char *m = CHKE(clEnqueueMapBuffer(q, sub, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, al,
                                               al, 0, NULL, NULL, E));
    SAME(m, model + al * 3, al, "map of sub-buffer");
    memset(m, 0x42, al);
    CHECK(clEnqueueUnmapMemObject(q, sub, m, 0, NULL, NULL));
    memset(model + al * 3, 0x42, al);
    CHECK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, psize, back, 0, NULL, NULL));
    SAME(back, model, psize, "parent after unmap of sub-buffer");
    /* A second, read-only sub-buffer; copy from it into the first. */
    cl_buffer_region r2 = {al * 10, al * 2};
    cl_mem sub2 = CHKE(clCreateSubBuffer(parent, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION,
                                         &r2, E));
    check_mem_info(sub2, CL_MEM_READ_ONLY, al * 2, NULL, parent, al * 10);
    CHECK(clEnqueueCopyBuffer(q, sub2, sub, 0, 0, al * 2, 0, NULL, NULL));
    memcpy(model + al * 2, model + al * 10, al * 2);
    CHECK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, psize, back, 0, NULL, NULL));
    SAME(back, model, psize, "copy between sub-buffers");

    /* Errors. */
    if (al > 1) {
        cl_buffer_region mis = {1, al};
        EXPECTE(CL_MISALIGNED_SUB_BUFFER_OFFSET,
                clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &mis, E));
    }
    cl_buffer_region oob = {al * 8, al * 9};
    EXPECTE(CL_INVALID_VALUE, clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &oob, E));
    cl_buffer_region zero = {0, 0};
    EXPECTE(CL_INVALID_BUFFER_SIZE, clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION,
                                                      &zero, E));
    cl_buffer_region r3 = {0, al};
    EXPECTE(CL_INVALID_MEM_OBJECT, clCreateSubBuffer(sub, 0, CL_BUFFER_CREATE_TYPE_REGION, &r3, E));
    EXPECT(CL_INVALID_VALUE, clEnqueueReadBuffer(q, sub, CL_TRUE, al * 4 - 1, 2, back, 0, NULL,
                                                 NULL));

    /* The parent stays usable through the sub-buffer after the application releases it. */
    CHECK(clReleaseMemObject(parent));
    CHECK(clEnqueueReadBuffer(q, sub, CL_TRUE, 0, al * 4, back, 0, NULL, NULL));
    SAME(back, model + al * 2, al * 4, "sub-buffer after parent release");
    CHECK(clReleaseMemObject(sub));
    CHECK(clReleaseMemObject(sub2));
    free(model); free(back); free(w);
}

/* ---- map/unmap ---- */
static void test_map(void) {
    enum { N = 1 << 20 };
    unsigned char *model = malloc(N), *back = malloc(N);
    fill_pattern(model, N, 15);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, N, model, E));

    /* Map for reading (blocking), whole and partial. */
    unsigned char *m = CHKE(clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 0, N, 0, NULL, NULL, E));
    SAME(m, model, N, "map read");
    cl_uint mc = 0;
    CHECK(clGetMemObjectInfo(b, CL_MEM_MAP_COUNT, sizeof mc, &mc, NULL));
    unsigned char *m2 = CHKE(clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 4097, 333, 0, NULL,
                                                NULL, E));
    SAME(m2, model + 4097, 333, "second overlapping read map");
    CHECK(clEnqueueUnmapMemObject(q, b, m2, 0, NULL, NULL));
    CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));

    /* Map for writing, modify, unmap, read back. */
    cl_event emap, eun;
    m = CHKE(clEnqueueMapBuffer(q, b, CL_FALSE, CL_MAP_WRITE, 1000, 50000, 0, NULL, &emap, E));
    CHECK(clWaitForEvents(1, &emap));
    cl_command_type ct = 0;
    CHECK(clGetEventInfo(emap, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_MAP_BUFFER, "map command type %#x", ct);
    SAME(m, model + 1000, 50000, "map write (contents valid for CL_MAP_WRITE)");
    fill_pattern(m, 50000, 16);
    memcpy(model + 1000, m, 50000);
    CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, &eun));
    CHECK(clWaitForEvents(1, &eun));
    CHECK(clGetEventInfo(eun, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_UNMAP_MEM_OBJECT, "unmap command type %#x", ct);
    CHECK(clReleaseEvent(emap));
    CHECK(clReleaseEvent(eun));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, model, N, "after map write/unmap");

    /* WRITE_INVALIDATE_REGION: the whole region is overwritten, the rest untouched. */
    m = CHKE(clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 77777, 100003, 0,
                                NULL, NULL, E));
    fill_pattern(m, 100003, 17);
    memcpy(model + 77777, m, 100003);
    CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, model, N, "after WRITE_INVALIDATE_REGION map");

    /* A kernel runs on the buffer after an unmap; a read map sees its result. */
    run_add(b, N / 4, 7u);
    for (size_t i = 0; i < N / 4; i++) {
        cl_uint v;
        memcpy(&v, model + 4 * i, 4);
        v += 7u;
        memcpy(model + 4 * i, &v, 4);
    }
    m = CHKE(clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 0, N, 0, NULL, NULL, E));
    SAME(m, model, N, "read map after kernel");
    CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));

    /* Errors. */
    EXPECTE(CL_INVALID_VALUE, clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, N - 10, 20, 0, NULL,
                                                 NULL, E));
    int not_mapped;
    EXPECT(CL_INVALID_VALUE, clEnqueueUnmapMemObject(q, b, &not_mapped, 0, NULL, NULL));
    CHECK(clFinish(q));
    CHECK(clReleaseMemObject(b));
    free(model); free(back);
}

static volatile int g_destroyed;
static void CL_CALLBACK mem_destructor(cl_mem m, void *ud) {
    (void)m;
    g_destroyed = *(int *)ud;
}

static void test_misc(void) {
    enum { N = 1 << 16 };
    unsigned char *model = malloc(N), *back = malloc(N);
    fill_pattern(model, N, 18);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, N, model, E));
    /* Migration keeps the contents unless told otherwise. */
    cl_event em;
    CHECK(clEnqueueMigrateMemObjects(q, 1, &b, 0, 0, NULL, &em));
    CHECK(clWaitForEvents(1, &em));
    cl_command_type ct = 0;
    CHECK(clGetEventInfo(em, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_MIGRATE_MEM_OBJECTS, "migrate command type %#x", ct);
    CHECK(clReleaseEvent(em));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, model, N, "after migrate");
    CHECK(clEnqueueMigrateMemObjects(q, 1, &b, CL_MIGRATE_MEM_OBJECT_HOST, 0, NULL, NULL));
    CHECK(clEnqueueMigrateMemObjects(q, 1, &b, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0, NULL,
                                     NULL));
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, N, model, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N, back, 0, NULL, NULL));
    SAME(back, model, N, "write after migrate content-undefined");
    EXPECT(CL_INVALID_VALUE, clEnqueueMigrateMemObjects(q, 0, NULL, 0, 0, NULL, NULL));

    /* Destructor callback runs once the object is gone. */
    static int tag = 31337;
    CHECK(clSetMemObjectDestructorCallback(b, mem_destructor, &tag));
    REQUIRE(g_destroyed == 0, "destructor called early");
    CHECK(clReleaseMemObject(b));
    CHECK(clFinish(q));
    for (int i = 0; i < 300 && !g_destroyed; i++) sleep_ms(10);
    REQUIRE(g_destroyed == 31337, "mem destructor callback not called (%d)", g_destroyed);

    /* Errors. */
    EXPECTE(CL_INVALID_BUFFER_SIZE, clCreateBuffer(ctx, 0, 0, NULL, E));
    cl_ulong maxalloc = device_ulong(g_device, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    t_err_ = -9999;
    cl_mem huge = clCreateBuffer(ctx, 0, (size_t)maxalloc + 1, NULL, E);
    REQUIRE(huge == NULL && (t_err_ == CL_INVALID_BUFFER_SIZE ||
                             t_err_ == CL_MEM_OBJECT_ALLOCATION_FAILURE),
            "buffer above max alloc: %d (%s)", t_err_, cl_err_name(t_err_));
    EXPECTE(CL_INVALID_HOST_PTR, clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, 64, NULL, E));
    EXPECTE(CL_INVALID_HOST_PTR, clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, 64, NULL, E));
    EXPECTE(CL_INVALID_HOST_PTR, clCreateBuffer(ctx, 0, 64, model, E));
    EXPECTE(CL_INVALID_VALUE, clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY, 64, NULL,
                                             E));
    EXPECTE(CL_INVALID_VALUE, clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR, 64,
                                             model, E));
    cl_mem s = CHKE(clCreateBuffer(ctx, 0, 1000, NULL, E));
    EXPECT(CL_INVALID_VALUE, clEnqueueReadBuffer(q, s, CL_TRUE, 990, 20, back, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueReadBuffer(q, s, CL_TRUE, 1000, 1, back, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueReadBuffer(q, s, CL_TRUE, 0, 10, NULL, 0, NULL, NULL));
    EXPECT(CL_INVALID_VALUE, clEnqueueWriteBuffer(q, s, CL_TRUE, 0, 1001, model, 0, NULL, NULL));
    {
        /* non-blocking: the error is reported at the call or at the next sync point */
        cl_int e1 = clEnqueueWriteBuffer(q, s, CL_FALSE, 999, 2, model, 0, NULL, NULL);
        cl_int e2 = clFinish(q);
        REQUIRE(e1 == CL_INVALID_VALUE || (e1 == CL_SUCCESS && e2 != CL_SUCCESS),
                "non-blocking write past end: enqueue %d (%s), finish %d (%s)", e1,
                cl_err_name(e1), e2, cl_err_name(e2));
    }
    EXPECT(CL_INVALID_MEM_OBJECT, clEnqueueReadBuffer(q, NULL, CL_TRUE, 0, 10, back, 0, NULL,
                                                      NULL));
    EXPECT(CL_INVALID_EVENT_WAIT_LIST, clEnqueueReadBuffer(q, s, CL_TRUE, 0, 10, back, 1, NULL,
                                                           NULL));
    EXPECT(CL_INVALID_MEM_OBJECT, clReleaseMemObject(NULL));
    CHECK(clReleaseMemObject(s));
    free(model); free(back);
}

/* A released cl_mem used again after newer allocations: through rgpu it is
 * CL_INVALID_MEM_OBJECT, not one of the newer buffers (the Khronos CTS found it writing into
 * one; native PoCL aborts here, so this runs through rgpu only). */
static void test_stale_handle(void) {
    if (!g_remote) return;
    cl_mem stale = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, 256, NULL, E));
    CHECK(clReleaseMemObject(stale));
    enum { N = 100 };
    cl_mem fresh[N];
    unsigned char zeros[256] = {0}, back[256];
    for (int i = 0; i < N; i++) {
        fresh[i] = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, 256, zeros,
                                       E));
        REQUIRE(fresh[i] != stale, "buffer %d has the released buffer's handle", i);
    }
    unsigned char ones[256];
    memset(ones, 1, sizeof ones);
    EXPECT(CL_INVALID_MEM_OBJECT, clEnqueueWriteBuffer(q, stale, CL_TRUE, 0, 256, ones, 0, NULL,
                                                       NULL));
    size_t size = 0;
    EXPECT(CL_INVALID_MEM_OBJECT, clGetMemObjectInfo(stale, CL_MEM_SIZE, sizeof size, &size,
                                                     NULL));
    EXPECT(CL_INVALID_MEM_OBJECT, clReleaseMemObject(stale));
    for (int i = 0; i < N; i++) {
        CHECK(clEnqueueReadBuffer(q, fresh[i], CL_TRUE, 0, 256, back, 0, NULL, NULL));
        REQUIRE(!memcmp(back, zeros, 256), "buffer %d changed through a released handle", i);
        CHECK(clReleaseMemObject(fresh[i]));
    }
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 1;
    select_device();
    ctx = make_context();
    q = make_queue(ctx, 0);
    prog = build_program(ctx, SRC, "");
    k_add = CHKE(clCreateKernel(prog, "add_u32", E));
    k_sum = CHKE(clCreateKernel(prog, "sum_u8", E));
    base_align = device_uint(g_device, CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8;
    if (base_align < 4) base_align = 4;
    for (int r = 0; r < reps; r++) {
        t_rng = 12345u + (uint32_t)r;
        test_create();
        test_read_write();
        test_copy_fill();
        test_rect();
        test_sub_buffers();
        test_map();
    }
    test_misc();
    test_stale_handle();
    CHECK(clReleaseKernel(k_add));
    CHECK(clReleaseKernel(k_sum));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    pass("buffers");
    return 0;
}
