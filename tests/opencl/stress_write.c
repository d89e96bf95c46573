/* Helper for the robustness tests (not an API group): writes a large buffer over and over.
 *   stress_write [MiB=256] [rounds=0 (forever)] [leak]
 * With "leak", exits without releasing anything.
 * Prints "WROTE <n>" after each completed round, so a test can kill it mid-transfer. */
#include "common.h"

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
    long rounds = argc > 2 ? atol(argv[2]) : 0;
    size_t size = mib << 20;
    select_device();
    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, 0);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, E));
    unsigned char *host = malloc(size);
    for (size_t i = 0; i < size; i++) host[i] = (unsigned char)(i * 131u);
    printf("START %zu MiB\n", mib);
    fflush(stdout);
    for (long n = 1; rounds == 0 || n <= rounds; n++) {
        /* Two halves non-blocking, then a blocking check of a few bytes. */
        CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, size / 2, host, 0, NULL, NULL));
        CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, size / 2, size - size / 2, host + size / 2, 0,
                                   NULL, NULL));
        unsigned char probe[16];
        CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, size - 16, 16, probe, 0, NULL, NULL));
        REQUIRE(!memcmp(probe, host + size - 16, 16), "probe after round %ld", n);
        printf("WROTE %ld\n", n);
        fflush(stdout);
    }
    if (argc > 3 && !strcmp(argv[3], "leak")) {
        pass("stress_write");
        exit(0);
    }
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    free(host);
    pass("stress_write");
    return 0;
}
