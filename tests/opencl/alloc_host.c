/* CL_MEM_ALLOC_HOST_PTR buffers mapped, written, computed on and read back: through a `unix:`
 * server their memory is host memory shared with the server (tests/test_shared_memory.py
 * checks that no data crossed the connection); natively and over TCP, ordinary buffers.
 *
 * 1. A (ALLOC_HOST_PTR, 16 MiB): mapped for writing (invalidating), filled, unmapped.
 * 2. B = 2 * A + 1 by a kernel, B also ALLOC_HOST_PTR; B mapped for reading (blocking) and
 *    checked; a second, non-blocking map of part of B with an event waited for.
 * 3. C (ALLOC_HOST_PTR | COPY_HOST_PTR): its initial contents mapped and checked.
 * 4. A sub-buffer of B: mapped at an aligned offset, written through the map, unmapped, and
 *    the parent read back with clEnqueueReadBuffer.
 * 5. clEnqueueWriteBuffer into A, then A mapped (CL_MAP_READ | CL_MAP_WRITE) and checked.
 * Prints "PASS alloc_host". */
#include "common.h"

#define N (4u << 20) /* uints: 16 MiB */

static const char *SRC =
    "__kernel void twice(__global const uint *a, __global uint *b) {\n"
    "  size_t i = get_global_id(0); b[i] = 2u * a[i] + 1u; }\n";

static void expect(const cl_uint *got, cl_uint at, cl_uint want, int line) {
    if (got[at] != want) {
        fprintf(stderr, "FAIL alloc_host.c:%d: [%u] = %u, expected %u\n", line, at, got[at], want);
        exit(1);
    }
}

int main(void) {
    select_device();
    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, 0);
    cl_program prog = build_program(ctx, SRC, "");
    cl_kernel k = CHKE(clCreateKernel(prog, "twice", E));
    size_t bytes = N * sizeof(cl_uint);
    cl_mem_flags alloc = CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR;
    cl_mem a = CHKE(clCreateBuffer(ctx, alloc, bytes, NULL, E));
    cl_mem b = CHKE(clCreateBuffer(ctx, alloc, bytes, NULL, E));

    /* 1 */
    cl_uint *pa = CHKE(clEnqueueMapBuffer(q, a, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, bytes,
                                          0, NULL, NULL, E));
    for (cl_uint i = 0; i < N; i++) pa[i] = i * 7u;
    CHECK(clEnqueueUnmapMemObject(q, a, pa, 0, NULL, NULL));

    /* 2 */
    CHECK(clSetKernelArg(k, 0, sizeof a, &a));
    CHECK(clSetKernelArg(k, 1, sizeof b, &b));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    cl_uint *pb = CHKE(clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 0, bytes, 0, NULL, NULL, E));
    for (cl_uint i = 0; i < N; i += 4099) expect(pb, i, 2u * (i * 7u) + 1u, __LINE__);
    expect(pb, N - 1, 2u * ((N - 1) * 7u) + 1u, __LINE__);
    cl_event mapped;
    size_t part = 1u << 20;
    cl_uint *pb2 = CHKE(clEnqueueMapBuffer(q, b, CL_FALSE, CL_MAP_READ, part, part, 0, NULL,
                                           &mapped, E));
    CHECK(clWaitForEvents(1, &mapped));
    expect(pb2, 0, 2u * ((part / 4) * 7u) + 1u, __LINE__);
    CHECK(clReleaseEvent(mapped));
    CHECK(clEnqueueUnmapMemObject(q, b, pb2, 0, NULL, NULL));
    CHECK(clEnqueueUnmapMemObject(q, b, pb, 0, NULL, NULL));

    /* 3 */
    cl_uint *initial = malloc(bytes);
    for (cl_uint i = 0; i < N; i++) initial[i] = ~i;
    cl_mem c = CHKE(clCreateBuffer(ctx, alloc | CL_MEM_COPY_HOST_PTR, bytes, initial, E));
    cl_uint *pc = CHKE(clEnqueueMapBuffer(q, c, CL_TRUE, CL_MAP_READ, 0, bytes, 0, NULL, NULL, E));
    for (cl_uint i = 0; i < N; i += 3001) expect(pc, i, ~i, __LINE__);
    CHECK(clEnqueueUnmapMemObject(q, c, pc, 0, NULL, NULL));

    /* 4 */
    cl_uint align_bits = 0;
    CHECK(clGetDeviceInfo(g_device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits,
                          NULL));
    size_t origin = align_bits / 8 > 4096 ? align_bits / 8 : 4096;
    cl_buffer_region region = {origin, part};
    cl_mem sub = CHKE(clCreateSubBuffer(b, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region,
                                        E));
    cl_uint *ps = CHKE(clEnqueueMapBuffer(q, sub, CL_TRUE, CL_MAP_WRITE, 0, part, 0, NULL, NULL, E));
    expect(ps, 0, 2u * ((origin / 4) * 7u) + 1u, __LINE__);
    for (cl_uint i = 0; i < part / 4; i++) ps[i] = 0xabc00000u + i;
    CHECK(clEnqueueUnmapMemObject(q, sub, ps, 0, NULL, NULL));
    cl_uint *back = malloc(bytes);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, bytes, back, 0, NULL, NULL));
    expect(back, origin / 4, 0xabc00000u, __LINE__);
    expect(back, origin / 4 + part / 4 - 1, 0xabc00000u + part / 4 - 1, __LINE__);
    expect(back, origin / 4 - 1, 2u * ((origin / 4 - 1) * 7u) + 1u, __LINE__);
    expect(back, origin / 4 + part / 4, 2u * ((origin / 4 + part / 4) * 7u) + 1u, __LINE__);

    /* 5 */
    for (cl_uint i = 0; i < N; i++) initial[i] = i ^ 0x5a5a5a5au;
    CHECK(clEnqueueWriteBuffer(q, a, CL_TRUE, 0, bytes, initial, 0, NULL, NULL));
    pa = CHKE(clEnqueueMapBuffer(q, a, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL, NULL,
                                 E));
    for (cl_uint i = 0; i < N; i += 2003) expect(pa, i, i ^ 0x5a5a5a5au, __LINE__);
    CHECK(clEnqueueUnmapMemObject(q, a, pa, 0, NULL, NULL));
    CHECK(clFinish(q));

    CHECK(clReleaseMemObject(sub));
    CHECK(clReleaseMemObject(a));
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseMemObject(c));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    free(initial);
    free(back);
    printf("PASS alloc_host\n");
    return 0;
}
