/* Images and samplers: formats, 1D/2D/3D/array/buffer images, read/write/copy/fill/map,
 * image<->buffer copies, image info, samplers and kernels that sample images. */
#include "common.h"

static const char *SRC =
    "__constant sampler_t cs = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
    "__kernel void sample_nearest(read_only image2d_t img, sampler_t s, __global uint4 *out,\n"
    "                             __global uint4 *out_cs, int w, int h) {\n"
    "  int x = get_global_id(0), y = get_global_id(1);\n"
    "  float2 c = (float2)(x - 2 + 0.5f, y - 1 + 0.5f);\n"
    "  out[y * (w + 4) + x] = read_imageui(img, s, c);\n"
    "  out_cs[y * (w + 4) + x] = read_imageui(img, cs, c);\n"
    "}\n"
    "__kernel void sample_linear(read_only image2d_t img, sampler_t s, __global float4 *out, int w) {\n"
    "  int i = get_global_id(0);\n"
    "  out[i] = read_imagef(img, s, (float2)((float)(i + 1) / w, 0.5f));\n"
    "}\n"
    "__kernel void write_img(write_only image2d_t img) {\n"
    "  int x = get_global_id(0), y = get_global_id(1);\n"
    "  write_imagef(img, (int2)(x, y), (float4)(x, y, x * y, x + 100 * y));\n"
    "}\n"
    "__kernel void read3d(read_only image3d_t img, sampler_t s, __global float4 *out) {\n"
    "  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
    "  int w = get_global_size(0), h = get_global_size(1);\n"
    "  out[(z * h + y) * w + x] = read_imagef(img, s, (int4)(x, y, z, 0));\n"
    "}\n";

static cl_context ctx;
static cl_command_queue q;

static void fill_bytes(void *p, size_t n, uint32_t seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        c[i] = (unsigned char)(seed >> 16);
    }
}

static int format_listed(cl_mem_object_type ty, cl_mem_flags fl, cl_image_format f) {
    cl_uint n = 0;
    CHECK(clGetSupportedImageFormats(ctx, fl, ty, 0, NULL, &n));
    cl_image_format *fs = calloc(n ? n : 1, sizeof *fs);
    CHECK(clGetSupportedImageFormats(ctx, fl, ty, n, fs, NULL));
    int found = 0;
    for (cl_uint i = 0; i < n; i++)
        found |= fs[i].image_channel_order == f.image_channel_order &&
                 fs[i].image_channel_data_type == f.image_channel_data_type;
    free(fs);
    return found;
}

static void test_formats(void) {
    static const cl_mem_object_type types[] = {CL_MEM_OBJECT_IMAGE1D, CL_MEM_OBJECT_IMAGE1D_ARRAY,
                                               CL_MEM_OBJECT_IMAGE1D_BUFFER, CL_MEM_OBJECT_IMAGE2D,
                                               CL_MEM_OBJECT_IMAGE2D_ARRAY, CL_MEM_OBJECT_IMAGE3D};
    static const cl_mem_flags flags[] = {CL_MEM_READ_ONLY, CL_MEM_WRITE_ONLY, CL_MEM_READ_WRITE};
    for (size_t t = 0; t < 6; t++)
        for (size_t f = 0; f < 3; f++) {
            cl_uint n = 0;
            CHECK(clGetSupportedImageFormats(ctx, flags[f], types[t], 0, NULL, &n));
            if (types[t] == CL_MEM_OBJECT_IMAGE2D || flags[f] == CL_MEM_READ_ONLY)
                REQUIRE(n > 0, "no formats for type %#x flags %#lx", types[t],
                        (unsigned long)flags[f]);
            if (n) {
                cl_image_format *fs = calloc(n, sizeof *fs);
                cl_uint n2 = 0;
                CHECK(clGetSupportedImageFormats(ctx, flags[f], types[t], n, fs, &n2));
                REQUIRE(n2 == n, "%u then %u formats", n, n2);
                for (cl_uint i = 0; i < n; i++)
                    REQUIRE(fs[i].image_channel_order >= 0x10B0 &&
                                fs[i].image_channel_order < 0x10D0 &&
                                fs[i].image_channel_data_type >= 0x10D0 &&
                                fs[i].image_channel_data_type < 0x10F0,
                            "odd format %#x/%#x", fs[i].image_channel_order,
                            fs[i].image_channel_data_type);
                free(fs);
            }
        }
    cl_image_format req[] = {{CL_RGBA, CL_UNORM_INT8}, {CL_RGBA, CL_UNSIGNED_INT8},
                             {CL_RGBA, CL_SIGNED_INT16}, {CL_RGBA, CL_UNSIGNED_INT32},
                             {CL_RGBA, CL_FLOAT}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        REQUIRE(format_listed(CL_MEM_OBJECT_IMAGE2D, CL_MEM_READ_WRITE, req[i]),
                "required 2D format %#x/%#x not listed", req[i].image_channel_order,
                req[i].image_channel_data_type);
    EXPECT(CL_INVALID_VALUE, clGetSupportedImageFormats(ctx, CL_MEM_READ_ONLY, CL_MEM_OBJECT_BUFFER,
                                                        0, NULL, &(cl_uint){0}));
}

static void check_image_info(cl_mem img, cl_image_format fmt, size_t elem, size_t w, size_t h,
                             size_t d, size_t arr, cl_mem_object_type ty) {
    cl_image_format f;
    size_t v = 0;
    CHECK(clGetImageInfo(img, CL_IMAGE_FORMAT, sizeof f, &f, NULL));
    REQUIRE(f.image_channel_order == fmt.image_channel_order &&
                f.image_channel_data_type == fmt.image_channel_data_type, "format");
    CHECK(clGetImageInfo(img, CL_IMAGE_ELEMENT_SIZE, sizeof v, &v, NULL));
    REQUIRE(v == elem, "element size %zu expected %zu", v, elem);
    CHECK(clGetImageInfo(img, CL_IMAGE_WIDTH, sizeof v, &v, NULL));
    REQUIRE(v == w, "width %zu expected %zu", v, w);
    CHECK(clGetImageInfo(img, CL_IMAGE_HEIGHT, sizeof v, &v, NULL));
    REQUIRE(v == h, "height %zu expected %zu", v, h);
    CHECK(clGetImageInfo(img, CL_IMAGE_DEPTH, sizeof v, &v, NULL));
    REQUIRE(v == d, "depth %zu expected %zu", v, d);
    CHECK(clGetImageInfo(img, CL_IMAGE_ARRAY_SIZE, sizeof v, &v, NULL));
    REQUIRE(v == arr, "array size %zu expected %zu", v, arr);
    CHECK(clGetImageInfo(img, CL_IMAGE_ROW_PITCH, sizeof v, &v, NULL));
    REQUIRE(v >= w * elem, "row pitch %zu < %zu", v, w * elem);
    CHECK(clGetImageInfo(img, CL_IMAGE_SLICE_PITCH, sizeof v, &v, NULL));
    cl_uint u = 99;
    CHECK(clGetImageInfo(img, CL_IMAGE_NUM_MIP_LEVELS, sizeof u, &u, NULL));
    REQUIRE(u == 0, "mip levels %u", u);
    CHECK(clGetImageInfo(img, CL_IMAGE_NUM_SAMPLES, sizeof u, &u, NULL));
    REQUIRE(u == 0, "samples %u", u);
    cl_mem_object_type t = 0;
    CHECK(clGetMemObjectInfo(img, CL_MEM_TYPE, sizeof t, &t, NULL));
    REQUIRE(t == ty, "mem type %#x expected %#x", t, ty);
    EXPECT(CL_INVALID_VALUE, clGetImageInfo(img, 0x7fff, sizeof v, &v, NULL));
}

static cl_mem make_image(cl_mem_flags fl, cl_image_format fmt, cl_mem_object_type ty, size_t w,
                         size_t h, size_t d, size_t arr, size_t rp, size_t sp, void *host) {
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = ty;
    desc.image_width = w;
    desc.image_height = h;
    desc.image_depth = d;
    desc.image_array_size = arr;
    desc.image_row_pitch = rp;
    desc.image_slice_pitch = sp;
    return CHKE(clCreateImage(ctx, fl, &fmt, &desc, host, E));
}

/* 2D RGBA uint8: write/read (with pitches), sub-regions, COPY_HOST_PTR, copy, fill, map,
 * image<->buffer, and sampling in a kernel. */
static void test_2d(cl_program prog) {
    enum { W = 37, H = 19, BPP = 4 };
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    unsigned char model[H][W][BPP], back[H][W][BPP];
    fill_bytes(model, sizeof model, 1);
    cl_mem img = make_image(CL_MEM_READ_WRITE, fmt, CL_MEM_OBJECT_IMAGE2D, W, H, 0, 0, 0, 0, NULL);
    check_image_info(img, fmt, BPP, W, H, 0, 0, CL_MEM_OBJECT_IMAGE2D);
    size_t o0[3] = {0, 0, 0}, full[3] = {W, H, 1};
    CHECK(clEnqueueWriteImage(q, img, CL_TRUE, o0, full, 0, 0, model, 0, NULL, NULL));
    memset(back, 0, sizeof back);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "2D write/read round trip");

    /* Sub-region write from a padded host buffer (row pitch), non-blocking. */
    enum { RW = 9, RH = 6, HP = 64 };
    unsigned char padded[RH][HP];
    fill_bytes(padded, sizeof padded, 2);
    size_t org[3] = {11, 7, 0}, reg[3] = {RW, RH, 1};
    cl_event ev;
    CHECK(clEnqueueWriteImage(q, img, CL_FALSE, org, reg, HP, 0, padded, 0, NULL, &ev));
    CHECK(clWaitForEvents(1, &ev));
    cl_command_type ct = 0;
    CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    REQUIRE(ct == CL_COMMAND_WRITE_IMAGE, "command type %#x", ct);
    CHECK(clReleaseEvent(ev));
    for (int y = 0; y < RH; y++) memcpy(model[7 + y][11], padded[y], RW * BPP);
    /* Sub-region read into a padded host buffer. */
    unsigned char rpad[RH + 2][HP];
    memset(rpad, 0x77, sizeof rpad);
    size_t org2[3] = {10, 6, 0}, reg2[3] = {RW + 2, RH + 2, 1};
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, org2, reg2, HP, 0, rpad, 0, NULL, NULL));
    for (int y = 0; y < RH + 2; y++) {
        REQUIRE(!memcmp(rpad[y], model[6 + y][10], (RW + 2) * BPP), "padded read row %d", y);
        for (int x = (RW + 2) * BPP; x < HP; x++)
            REQUIRE(rpad[y][x] == 0x77, "read wrote into padding at row %d byte %d", y, x);
    }

    /* COPY_HOST_PTR with a row pitch. */
    enum { CP = W * BPP + 12 };
    unsigned char *src = calloc(H, CP);
    for (int y = 0; y < H; y++) memcpy(src + y * CP, model[y], W * BPP);
    cl_mem img2 = make_image(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, fmt, CL_MEM_OBJECT_IMAGE2D,
                             W, H, 0, 0, CP, 0, src);
    memset(src, 0, (size_t)H * CP);
    CHECK(clEnqueueReadImage(q, img2, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "COPY_HOST_PTR image contents");
    free(src);

    /* Copy a region image -> image. */
    unsigned char m2[H][W][BPP];
    memcpy(m2, model, sizeof m2);
    fill_bytes(model, sizeof model, 3);
    CHECK(clEnqueueWriteImage(q, img, CL_TRUE, o0, full, 0, 0, model, 0, NULL, NULL));
    size_t so[3] = {2, 3, 0}, dor[3] = {20, 9, 0}, cr[3] = {13, 8, 1};
    CHECK(clEnqueueCopyImage(q, img, img2, so, dor, cr, 0, NULL, NULL));
    for (int y = 0; y < 8; y++) memcpy(m2[9 + y][20], model[3 + y][2], 13 * BPP);
    CHECK(clEnqueueReadImage(q, img2, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, m2, sizeof m2), "copy image region");

    /* Fill a region. */
    cl_uint4 color = {{1, 2, 250, 77}};
    size_t fo[3] = {5, 4, 0}, fr[3] = {10, 3, 1};
    CHECK(clEnqueueFillImage(q, img2, &color, fo, fr, 0, NULL, NULL));
    for (int y = 4; y < 7; y++)
        for (int x = 5; x < 15; x++)
            for (int c = 0; c < 4; c++) m2[y][x][c] = (unsigned char)color.s[c];
    CHECK(clEnqueueReadImage(q, img2, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, m2, sizeof m2), "fill image region");

    /* Image -> buffer -> image. */
    size_t bo = 40;
    cl_mem buf = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, bo + sizeof model, NULL, E));
    CHECK(clEnqueueCopyImageToBuffer(q, img2, buf, o0, full, bo, 0, NULL, NULL));
    unsigned char *bb = malloc(sizeof model);
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, bo, sizeof model, bb, 0, NULL, NULL));
    REQUIRE(!memcmp(bb, m2, sizeof m2), "copy image to buffer");
    /* a region of the buffer into a region of img */
    size_t io[3] = {1, 2, 0}, ir[3] = {6, 5, 1};
    CHECK(clEnqueueCopyBufferToImage(q, buf, img, bo + 8, io, ir, 0, NULL, NULL));
    for (int y = 0; y < 5; y++) memcpy(model[2 + y][1], bb + 8 + (size_t)y * 6 * BPP, 6 * BPP);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "copy buffer to image");
    free(bb);
    CHECK(clReleaseMemObject(buf));

    /* Map for reading and writing. */
    size_t rp = 0, sp = 0, mo[3] = {3, 2, 0}, mr[3] = {20, 10, 1};
    unsigned char *m = CHKE(clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ, mo, mr, &rp, &sp, 0,
                                              NULL, NULL, E));
    REQUIRE(rp >= 20 * BPP, "mapped row pitch %zu", rp);
    for (int y = 0; y < 10; y++)
        REQUIRE(!memcmp(m + y * rp, model[2 + y][3], 20 * BPP), "mapped image row %d", y);
    CHECK(clEnqueueUnmapMemObject(q, img, m, 0, NULL, NULL));
    m = CHKE(clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_WRITE, mo, mr, &rp, &sp, 0, NULL, NULL, E));
    for (int y = 0; y < 10; y++)
        for (int x = 0; x < 20 * BPP; x++) {
            m[y * rp + x] = (unsigned char)(x + y * 3);
            model[2 + y][3 + x / BPP][x % BPP] = (unsigned char)(x + y * 3);
        }
    CHECK(clEnqueueUnmapMemObject(q, img, m, 0, NULL, NULL));
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "image after write map");

    /* Sample it in a kernel: nearest, unnormalized, clamp-to-edge (argument sampler) and
     * clamp (program-scope sampler, border colour 0). */
    cl_sampler s = CHKE(clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST,
                                        E));
    cl_kernel k = CHKE(clCreateKernel(prog, "sample_nearest", E));
    size_t on = (size_t)(W + 4) * (H + 2);
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, on * sizeof(cl_uint4), NULL, E));
    cl_mem out2 = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, on * sizeof(cl_uint4), NULL, E));
    cl_int w = W, h = H;
    CHECK(clSetKernelArg(k, 0, sizeof img, &img));
    CHECK(clSetKernelArg(k, 1, sizeof s, &s));
    CHECK(clSetKernelArg(k, 2, sizeof out, &out));
    CHECK(clSetKernelArg(k, 3, sizeof out2, &out2));
    CHECK(clSetKernelArg(k, 4, sizeof w, &w));
    CHECK(clSetKernelArg(k, 5, sizeof h, &h));
    size_t gws[2] = {W + 4, H + 2};
    CHECK(clEnqueueNDRangeKernel(q, k, 2, NULL, gws, NULL, 0, NULL, NULL));
    cl_uint4 *res = malloc(on * sizeof *res), *res2 = malloc(on * sizeof *res2);
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, on * sizeof *res, res, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, out2, CL_TRUE, 0, on * sizeof *res2, res2, 0, NULL, NULL));
    for (int y = 0; y < H + 2; y++)
        for (int x = 0; x < W + 4; x++) {
            int ix = x - 2, iy = y - 1;
            int cx = ix < 0 ? 0 : ix >= W ? W - 1 : ix, cy = iy < 0 ? 0 : iy >= H ? H - 1 : iy;
            int inside = ix >= 0 && ix < W && iy >= 0 && iy < H;
            for (int c = 0; c < 4; c++) {
                cl_uint got = res[y * (W + 4) + x].s[c];
                REQUIRE(got == model[cy][cx][c], "sampled (%d,%d).%d = %u expected %u", ix, iy, c,
                        got, model[cy][cx][c]);
                cl_uint got2 = res2[y * (W + 4) + x].s[c];
                cl_uint want2 = inside ? model[iy][ix][c] : 0;
                REQUIRE(got2 == want2, "constant-sampler (%d,%d).%d = %u expected %u", ix, iy, c,
                        got2, want2);
            }
        }
    free(res); free(res2);
    CHECK(clReleaseMemObject(out));
    CHECK(clReleaseMemObject(out2));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseSampler(s));

    /* Errors. */
    size_t big[3] = {W + 1, H, 1};
    EXPECT(CL_INVALID_VALUE, clEnqueueReadImage(q, img, CL_TRUE, o0, big, 0, 0, back, 0, NULL,
                                                NULL));
    CHECK(clReleaseMemObject(img));
    CHECK(clReleaseMemObject(img2));
}

/* 2D float image written by a kernel, then sampled with a linear/normalized/repeat sampler. */
static void test_kernel_write_and_linear(cl_program prog) {
    enum { W = 8, H = 4 };
    cl_image_format fmt = {CL_RGBA, CL_FLOAT};
    cl_mem img = make_image(CL_MEM_READ_WRITE, fmt, CL_MEM_OBJECT_IMAGE2D, W, H, 0, 0, 0, 0, NULL);
    cl_kernel kw = CHKE(clCreateKernel(prog, "write_img", E));
    CHECK(clSetKernelArg(kw, 0, sizeof img, &img));
    size_t gws[2] = {W, H};
    CHECK(clEnqueueNDRangeKernel(q, kw, 2, NULL, gws, NULL, 0, NULL, NULL));
    float px[H][W][4];
    size_t o0[3] = {0, 0, 0}, full[3] = {W, H, 1};
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o0, full, 0, 0, px, 0, NULL, NULL));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            float want[4] = {(float)x, (float)y, (float)(x * y), (float)(x + 100 * y)};
            for (int c = 0; c < 4; c++)
                REQUIRE(px[y][x][c] == want[c], "kernel-written (%d,%d).%d = %g expected %g", x, y,
                        c, px[y][x][c], want[c]);
        }

    cl_sampler_properties sp[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_TRUE,
                                  CL_SAMPLER_ADDRESSING_MODE, CL_ADDRESS_REPEAT,
                                  CL_SAMPLER_FILTER_MODE, CL_FILTER_LINEAR, 0};
    cl_sampler s = CHKE(clCreateSamplerWithProperties(ctx, sp, E));
    cl_bool nc = 0;
    cl_addressing_mode am = 0;
    cl_filter_mode fm = 0;
    cl_uint rc = 0;
    cl_context c = NULL;
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_NORMALIZED_COORDS, sizeof nc, &nc, NULL));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_ADDRESSING_MODE, sizeof am, &am, NULL));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_FILTER_MODE, sizeof fm, &fm, NULL));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_REFERENCE_COUNT, sizeof rc, &rc, NULL));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_CONTEXT, sizeof c, &c, NULL));
    REQUIRE(nc == CL_TRUE && am == CL_ADDRESS_REPEAT && fm == CL_FILTER_LINEAR && rc == 1 &&
                c == ctx, "sampler info %u %#x %#x %u", nc, am, fm, rc);
    if (device_version(g_device) >= 30) {
        cl_sampler_properties got[8] = {0};
        size_t n = 0;
        CHECK(clGetSamplerInfo(s, CL_SAMPLER_PROPERTIES, sizeof got, got, &n));
        REQUIRE(n == sizeof sp && !memcmp(got, sp, sizeof sp), "CL_SAMPLER_PROPERTIES size %zu", n);
    }
    CHECK(clRetainSampler(s));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_REFERENCE_COUNT, sizeof rc, &rc, NULL));
    REQUIRE(rc == 2, "sampler refcount after retain %u", rc);
    CHECK(clReleaseSampler(s));

    cl_kernel kl = CHKE(clCreateKernel(prog, "sample_linear", E));
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, W * sizeof(cl_float4), NULL, E));
    cl_int w = W;
    CHECK(clSetKernelArg(kl, 0, sizeof img, &img));
    CHECK(clSetKernelArg(kl, 1, sizeof s, &s));
    CHECK(clSetKernelArg(kl, 2, sizeof out, &out));
    CHECK(clSetKernelArg(kl, 3, sizeof w, &w));
    size_t g = W;
    CHECK(clEnqueueNDRangeKernel(q, kl, 1, NULL, &g, NULL, 0, NULL, NULL));
    cl_float4 res[W];
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL));
    /* (i+1)/W lies half way between pixel i and i+1 (repeat wraps W-1 to 0), on the rows 1 and
     * 2 boundary (v = 0.5 with H = 4 rows: between row 1 and row 2). */
    for (int i = 0; i < W; i++) {
        int a = i, b = (i + 1) % W;
        for (int ch = 0; ch < 4; ch++) {
            float sum = 0;
            for (int y = 1; y <= 2; y++) sum += px[y][a][ch] + px[y][b][ch];
            float want = sum / 4;
            float got = res[i].s[ch];
            REQUIRE(got > want - 1e-3f * (1 + want) && got < want + 1e-3f * (1 + want),
                    "linear sample %d.%d = %g expected %g", i, ch, got, want);
        }
    }
    CHECK(clReleaseMemObject(out));
    CHECK(clReleaseKernel(kl));
    CHECK(clReleaseKernel(kw));
    CHECK(clReleaseSampler(s));
    CHECK(clReleaseMemObject(img));
}

/* 3D float image with host data (row/slice pitch), read/write regions, copy, kernel read. */
static void test_3d(cl_program prog) {
    enum { W = 11, H = 7, D = 5 };
    cl_image_format fmt = {CL_RGBA, CL_FLOAT};
    float model[D][H][W][4], back[D][H][W][4];
    for (int z = 0; z < D; z++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 4; c++) model[z][y][x][c] = (float)(((z * 7 + y) * 13 + x) * 4 + c);
    cl_mem img = make_image(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, fmt, CL_MEM_OBJECT_IMAGE3D,
                            W, H, D, 0, 0, 0, model);
    check_image_info(img, fmt, 16, W, H, D, 0, CL_MEM_OBJECT_IMAGE3D);
    size_t o0[3] = {0, 0, 0}, full[3] = {W, H, D};
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "3D COPY_HOST_PTR contents");
    /* Write a box from a host box with explicit pitches. */
    enum { BW = 4, BH = 3, BD = 2, RP = BW * 16 + 16, SP = RP * (BH + 1) };
    unsigned char *box = calloc(BD, SP);
    for (int z = 0; z < BD; z++)
        for (int y = 0; y < BH; y++)
            for (int x = 0; x < BW * 4; x++) ((float *)(box + z * SP + y * RP))[x] = -1.0f - x - 10 * y - 100 * z;
    size_t bo[3] = {6, 2, 3}, br[3] = {BW, BH, BD};
    CHECK(clEnqueueWriteImage(q, img, CL_TRUE, bo, br, RP, SP, box, 0, NULL, NULL));
    for (int z = 0; z < BD; z++)
        for (int y = 0; y < BH; y++)
            memcpy(model[3 + z][2 + y][6], box + z * SP + y * RP, BW * 16);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o0, full, 0, 0, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "3D write box with pitches");
    /* Read a box into pitched host memory. */
    memset(box, 0, (size_t)BD * SP);
    size_t ro[3] = {1, 1, 1};
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, ro, br, RP, SP, box, 0, NULL, NULL));
    for (int z = 0; z < BD; z++)
        for (int y = 0; y < BH; y++)
            REQUIRE(!memcmp(box + z * SP + y * RP, model[1 + z][1 + y][1], BW * 16),
                    "3D read box row %d slice %d", y, z);
    free(box);
    /* Copy within the image (disjoint regions) and into a 2D image. */
    cl_mem img2 = make_image(CL_MEM_READ_WRITE, fmt, CL_MEM_OBJECT_IMAGE2D, W, H, 0, 0, 0, 0, NULL);
    size_t so[3] = {0, 0, 4}, dst0[3] = {0, 0, 0}, cr[3] = {W, H, 1};
    CHECK(clEnqueueCopyImage(q, img, img2, so, dst0, cr, 0, NULL, NULL));
    float slice[H][W][4];
    CHECK(clEnqueueReadImage(q, img2, CL_TRUE, o0, cr, 0, 0, slice, 0, NULL, NULL));
    REQUIRE(!memcmp(slice, model[4], sizeof slice), "copy 3D slice into 2D image");
    /* Kernel reads the 3D image element by element. */
    cl_sampler s = CHKE(clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_NONE, CL_FILTER_NEAREST, E));
    cl_kernel k = CHKE(clCreateKernel(prog, "read3d", E));
    cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof model, NULL, E));
    CHECK(clSetKernelArg(k, 0, sizeof img, &img));
    CHECK(clSetKernelArg(k, 1, sizeof s, &s));
    CHECK(clSetKernelArg(k, 2, sizeof out, &out));
    size_t gws[3] = {W, H, D};
    CHECK(clEnqueueNDRangeKernel(q, k, 3, NULL, gws, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    REQUIRE(!memcmp(back, model, sizeof model), "3D image read by kernel");
    /* Map a 3D region. */
    size_t rp = 0, sp = 0, mo[3] = {2, 1, 1}, mr[3] = {5, 4, 3};
    float *m = CHKE(clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ, mo, mr, &rp, &sp, 0, NULL,
                                      NULL, E));
    REQUIRE(rp >= 5 * 16 && sp >= rp * 4, "3D map pitches %zu %zu", rp, sp);
    for (int z = 0; z < 3; z++)
        for (int y = 0; y < 4; y++)
            REQUIRE(!memcmp((char *)m + z * sp + y * rp, model[1 + z][1 + y][2], 5 * 16),
                    "3D mapped row %d slice %d", y, z);
    CHECK(clEnqueueUnmapMemObject(q, img, m, 0, NULL, NULL));
    CHECK(clReleaseMemObject(out));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseSampler(s));
    CHECK(clReleaseMemObject(img));
    CHECK(clReleaseMemObject(img2));
}

/* 1D, 1D array, 2D array, 1D buffer images. */
static void test_1d_and_arrays(void) {
    /* 1D, RGBA int16, no host data; fill then partial write. */
    enum { W1 = 100 };
    cl_image_format f16 = {CL_RGBA, CL_SIGNED_INT16};
    cl_mem i1 = make_image(CL_MEM_READ_WRITE, f16, CL_MEM_OBJECT_IMAGE1D, W1, 0, 0, 0, 0, 0, NULL);
    check_image_info(i1, f16, 8, W1, 0, 0, 0, CL_MEM_OBJECT_IMAGE1D);
    short model1[W1][4], back1[W1][4];
    cl_int4 col = {{-5, 300, -32768, 32767}};
    size_t o0[3] = {0, 0, 0}, r1[3] = {W1, 1, 1};
    CHECK(clEnqueueFillImage(q, i1, &col, o0, r1, 0, NULL, NULL));
    for (int x = 0; x < W1; x++)
        for (int c = 0; c < 4; c++) model1[x][c] = (short)col.s[c];
    short part[30][4];
    fill_bytes(part, sizeof part, 4);
    size_t po[3] = {50, 0, 0}, pr[3] = {30, 1, 1};
    CHECK(clEnqueueWriteImage(q, i1, CL_TRUE, po, pr, 0, 0, part, 0, NULL, NULL));
    memcpy(model1[50], part, sizeof part);
    CHECK(clEnqueueReadImage(q, i1, CL_TRUE, o0, r1, 0, 0, back1, 0, NULL, NULL));
    REQUIRE(!memcmp(back1, model1, sizeof model1), "1D image fill+write");
    CHECK(clReleaseMemObject(i1));

    /* 1D array, RGBA uint32, with host data. */
    enum { WA = 50, NA = 4 };
    cl_image_format f32 = {CL_RGBA, CL_UNSIGNED_INT32};
    cl_uint ma[NA][WA][4], ba[NA][WA][4];
    fill_bytes(ma, sizeof ma, 5);
    cl_mem ia = make_image(CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, f32,
                           CL_MEM_OBJECT_IMAGE1D_ARRAY, WA, 0, 0, NA, 0, 0, ma);
    check_image_info(ia, f32, 16, WA, 0, 0, NA, CL_MEM_OBJECT_IMAGE1D_ARRAY);
    size_t ra[3] = {WA, NA, 1};
    CHECK(clEnqueueReadImage(q, ia, CL_TRUE, o0, ra, 0, 0, ba, 0, NULL, NULL));
    REQUIRE(!memcmp(ba, ma, sizeof ma), "1D array contents");
    size_t lo[3] = {10, 2, 0}, lr[3] = {20, 1, 1};
    cl_uint layer[20][4];
    CHECK(clEnqueueReadImage(q, ia, CL_TRUE, lo, lr, 0, 0, layer, 0, NULL, NULL));
    REQUIRE(!memcmp(layer, ma[2][10], sizeof layer), "1D array layer region");
    /* Mapping layers of a 1D array: its slice pitch is its row pitch (one row per layer), and
     * stepping by it through every mapped layer stays inside the mapping (the CTS's
     * test_images map test found a client that reported row pitch x layers and overflowed). */
    size_t mo[3] = {5, 1, 0}, mr[3] = {30, 3, 1}, rp = 0, sp = 0;
    unsigned char *mapped = CHKE(clEnqueueMapImage(q, ia, CL_TRUE, CL_MAP_READ, mo, mr, &rp, &sp,
                                                   0, NULL, NULL, E));
    REQUIRE(rp >= 30 * 16 && sp == rp, "1D array map pitches: row %zu slice %zu", rp, sp);
    for (size_t l = 0; l < 3; l++)
        REQUIRE(!memcmp(mapped + l * sp, ma[1 + l][5], 30 * 16), "mapped 1D array layer %zu",
                l);
    CHECK(clEnqueueUnmapMemObject(q, ia, mapped, 0, NULL, NULL));
    CHECK(clFinish(q));
    CHECK(clReleaseMemObject(ia));

    /* 2D array, RGBA unorm8, without then with writes per layer. */
    enum { W2 = 16, H2 = 8, N2 = 3 };
    cl_image_format fu8 = {CL_RGBA, CL_UNORM_INT8};
    cl_mem i2a = make_image(CL_MEM_READ_WRITE, fu8, CL_MEM_OBJECT_IMAGE2D_ARRAY, W2, H2, 0, N2, 0,
                            0, NULL);
    check_image_info(i2a, fu8, 4, W2, H2, 0, N2, CL_MEM_OBJECT_IMAGE2D_ARRAY);
    unsigned char m2[N2][H2][W2][4], b2[N2][H2][W2][4];
    fill_bytes(m2, sizeof m2, 6);
    for (int l = 0; l < N2; l++) {
        size_t lo2[3] = {0, 0, (size_t)l}, lr2[3] = {W2, H2, 1};
        CHECK(clEnqueueWriteImage(q, i2a, CL_FALSE, lo2, lr2, 0, 0, m2[l], 0, NULL, NULL));
    }
    size_t r2[3] = {W2, H2, N2};
    CHECK(clEnqueueReadImage(q, i2a, CL_TRUE, o0, r2, 0, 0, b2, 0, NULL, NULL));
    REQUIRE(!memcmp(b2, m2, sizeof m2), "2D array per-layer writes");
    cl_float4 fc = {{1.0f, 0.0f, 0.5f, 1.0f}};
    size_t fo[3] = {2, 2, 1}, fr[3] = {3, 3, 2};
    CHECK(clEnqueueFillImage(q, i2a, &fc, fo, fr, 0, NULL, NULL));
    CHECK(clEnqueueReadImage(q, i2a, CL_TRUE, o0, r2, 0, 0, b2, 0, NULL, NULL));
    for (int l = 1; l < 3; l++)
        for (int y = 2; y < 5; y++)
            for (int x = 2; x < 5; x++) {
                REQUIRE(b2[l][y][x][0] == 255 && b2[l][y][x][1] == 0 && b2[l][y][x][3] == 255 &&
                            (b2[l][y][x][2] == 127 || b2[l][y][x][2] == 128),
                        "unorm fill pixel (%d,%d,%d) = %u %u %u %u", x, y, l, b2[l][y][x][0],
                        b2[l][y][x][1], b2[l][y][x][2], b2[l][y][x][3]);
                memcpy(m2[l][y][x], b2[l][y][x], 4);
            }
    REQUIRE(!memcmp(b2, m2, sizeof m2), "2D array outside the fill untouched");
    CHECK(clReleaseMemObject(i2a));

    /* 1D image from a buffer shares its storage. */
    enum { WB = 64 };
    cl_image_format f8 = {CL_RGBA, CL_UNSIGNED_INT8};
    if (format_listed(CL_MEM_OBJECT_IMAGE1D_BUFFER, CL_MEM_READ_WRITE, f8)) {
        unsigned char mb[WB][4], bb[WB][4];
        fill_bytes(mb, sizeof mb, 7);
        cl_mem buf = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof mb,
                                         mb, E));
        cl_image_desc d;
        memset(&d, 0, sizeof d);
        d.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER;
        d.image_width = WB;
        d.buffer = buf;
        cl_mem ib = CHKE(clCreateImage(ctx, CL_MEM_READ_WRITE, &f8, &d, NULL, E));
        cl_mem assoc = NULL;
        CHECK(clGetImageInfo(ib, CL_IMAGE_BUFFER, sizeof assoc, &assoc, NULL));
        REQUIRE(assoc == buf, "CL_IMAGE_BUFFER %p expected %p", (void *)assoc, (void *)buf);
        size_t rb[3] = {WB, 1, 1};
        CHECK(clEnqueueReadImage(q, ib, CL_TRUE, o0, rb, 0, 0, bb, 0, NULL, NULL));
        REQUIRE(!memcmp(bb, mb, sizeof mb), "1D buffer image contents");
        CHECK(clReleaseMemObject(ib));
        CHECK(clReleaseMemObject(buf));
    }

    /* Errors. */
    cl_image_format f = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc zd;
    memset(&zd, 0, sizeof zd);
    zd.image_type = CL_MEM_OBJECT_IMAGE2D;
    zd.image_width = 0;
    zd.image_height = 4;
    t_err_ = -9999;
    cl_mem bad = clCreateImage(ctx, CL_MEM_READ_WRITE, &f, &zd, NULL, E);
    /* PoCL answers CL_INVALID_BUFFER_SIZE. */
    REQUIRE(bad == NULL && (t_err_ == CL_INVALID_IMAGE_SIZE || t_err_ == CL_INVALID_IMAGE_DESCRIPTOR ||
                            t_err_ == CL_INVALID_BUFFER_SIZE),
            "zero-width image: %d (%s)", t_err_, cl_err_name(t_err_));
    zd.image_width = 4;
    cl_image_format badf = {CL_RGB, CL_UNSIGNED_INT8}; /* RGB needs a packed type */
    t_err_ = -9999;
    bad = clCreateImage(ctx, CL_MEM_READ_WRITE, &badf, &zd, NULL, E);
    /* Spec: CL_INVALID_IMAGE_FORMAT_DESCRIPTOR; PoCL answers CL_INVALID_OPERATION. */
    REQUIRE(bad == NULL && t_err_ < 0,
            "RGB/UINT8 image: %d (%s)", t_err_, cl_err_name(t_err_));
    EXPECTE(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR, clCreateImage(ctx, CL_MEM_READ_WRITE, NULL, &zd,
                                                              NULL, E));
}

static void test_sampler_basics(void) {
    cl_sampler s = CHKE(clCreateSampler(ctx, CL_TRUE, CL_ADDRESS_MIRRORED_REPEAT, CL_FILTER_NEAREST,
                                        E));
    cl_bool nc = 0;
    cl_addressing_mode am = 0;
    cl_filter_mode fm = 0;
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_NORMALIZED_COORDS, sizeof nc, &nc, NULL));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_ADDRESSING_MODE, sizeof am, &am, NULL));
    CHECK(clGetSamplerInfo(s, CL_SAMPLER_FILTER_MODE, sizeof fm, &fm, NULL));
    REQUIRE(nc == CL_TRUE && am == CL_ADDRESS_MIRRORED_REPEAT && fm == CL_FILTER_NEAREST,
            "sampler info %u %#x %#x", nc, am, fm);
    EXPECT(CL_INVALID_VALUE, clGetSamplerInfo(s, 0x7fff, sizeof nc, &nc, NULL));
    CHECK(clReleaseSampler(s));
    /* Mirrored repeat needs normalized coordinates. */
    EXPECTE(CL_INVALID_VALUE, clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_MIRRORED_REPEAT,
                                              CL_FILTER_NEAREST, E));
    cl_sampler_properties bad[] = {0x7fff, 1, 0};
    t_err_ = -9999;
    cl_sampler sb = clCreateSamplerWithProperties(ctx, bad, E);
    REQUIRE(sb == NULL && (t_err_ == CL_INVALID_VALUE || t_err_ == CL_INVALID_PROPERTY),
            "unknown sampler property: %d (%s)", t_err_, cl_err_name(t_err_));
}

int main(void) {
    select_device();
    cl_bool images = CL_FALSE;
    CHECK(clGetDeviceInfo(g_device, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL));
    if (!images) {
        printf("PASS images_samplers (skipped: device has no image support)\n");
        return 0;
    }
    ctx = make_context();
    q = make_queue(ctx, 0);
    cl_program prog = build_program(ctx, SRC, "");
    test_formats();
    test_2d(prog);
    test_kernel_write_and_linear(prog);
    test_3d(prog);
    test_1d_and_arrays();
    test_sampler_basics();
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    pass("images_samplers");
    return 0;
}
