/* Helper for the robustness tests (not an API group): moves a large buffer over and over.
 *   stress_write [MiB=256] [rounds=0 (forever)] [write|read|leak]
 * write (default): non-blocking writes of the whole buffer, then a small blocking read;
 * read: blocking reads of the whole buffer; leak: like write, then exits without releasing.
 * Prints "START" once the buffer exists and "WROTE <n>" after each completed round, so a test
 * can kill it mid-transfer. */
#include "common.h"

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
    long rounds = argc > 2 ? atol(argv[2]) : 0;
    const char *mode = argc > 3 ? argv[3] : "write";
    int reading = !strcmp(mode, "read"), leak = !strcmp(mode, "leak");
    size_t size = mib << 20;
    select_device();
    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, 0);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, E));
    unsigned char *host = malloc(size), *back = reading ? malloc(size) : NULL;
    for (size_t i = 0; i < size; i++) host[i] = (unsigned char)(i * 131u);
    if (reading) CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, size, host, 0, NULL, NULL));
    printf("START %zu MiB %s\n", mib, mode);
    fflush(stdout);
    for (long n = 1; rounds == 0 || n <= rounds; n++) {
        if (reading) {
            back[0] = (unsigned char)~host[0];
            back[size - 1] = (unsigned char)~host[size - 1];
            CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, size, back, 0, NULL, NULL));
            REQUIRE(back[0] == host[0] && back[size - 1] == host[size - 1], "read round %ld", n);
        } else {
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, size / 2, host, 0, NULL, NULL));
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, size / 2, size - size / 2, host + size / 2,
                                       0, NULL, NULL));
            unsigned char probe[16];
            CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, size - 16, 16, probe, 0, NULL, NULL));
            REQUIRE(!memcmp(probe, host + size - 16, 16), "probe after round %ld", n);
        }
        printf("WROTE %ld\n", n);
        fflush(stdout);
    }
    if (leak) {
        pass("stress_write");
        exit(0);
    }
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    free(host);
    free(back);
    pass("stress_write");
    return 0;
}
