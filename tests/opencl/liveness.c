/* Helper for the liveness tests (tests/test_liveness.py; not an API group).
 *   liveness writes          a first blocking 2 MiB write, "READY", then after a line on stdin
 *                            blocking 2 MiB writes forever, "WROTE <n>" after each (a write
 *                            that fails ends the program with FAIL and status 1);
 *   liveness kernel SECONDS  a kernel that spins for about SECONDS (calibrated on a short one),
 *                            waited for with clFinish: "KERNEL <seconds>" and PASS. */
#include "common.h"

static const char *SPIN =
    "__kernel void spin(__global ulong *out, ulong n) {\n"
    "    ulong x = out[0];\n"
    "    for (ulong i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;\n"
    "    out[0] = x;\n"
    "}\n";

/* Runs the spin kernel for `n` rounds and waits: the seconds it took. */
static double spin(cl_command_queue q, cl_kernel k, cl_ulong n) {
    CHECK(clSetKernelArg(k, 1, sizeof n, &n));
    size_t one = 1;
    double t0 = now_s();
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, &one, 0, NULL, NULL));
    CHECK(clFinish(q));
    return now_s() - t0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "writes";
    select_device();
    cl_context ctx = make_context();
    cl_command_queue q = make_queue(ctx, 0);
    if (!strcmp(mode, "kernel")) {
        double seconds = argc > 2 ? atof(argv[2]) : 60;
        cl_program p = build_program(ctx, SPIN, "");
        cl_kernel k = CHKE(clCreateKernel(p, "spin", E));
        cl_ulong seed = 1;
        cl_mem out = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                         sizeof seed, &seed, E));
        CHECK(clSetKernelArg(k, 0, sizeof out, &out));
        /* Rounds per second, from a run long enough to dwarf a round trip. */
        cl_ulong probe = 1u << 22;
        double took;
        while ((took = spin(q, k, probe)) < 0.5 && probe < ((cl_ulong)1 << 40)) probe *= 4;
        cl_ulong rounds = (cl_ulong)((double)probe / took * seconds);
        took = spin(q, k, rounds);
        printf("KERNEL %.1f\n", took);
        REQUIRE(took > seconds * 0.5, "the kernel took %.1f s, not about %.0f", took, seconds);
        pass("liveness");
        return 0;
    }
    size_t size = 2u << 20;
    unsigned char *host = malloc(size);
    for (size_t i = 0; i < size; i++) host[i] = (unsigned char)(i * 131u);
    cl_mem b = CHKE(clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, E));
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, size, host, 0, NULL, NULL));
    CHECK(clFinish(q));
    printf("READY\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (long n = 1;; n++) {
        CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, size, host, 0, NULL, NULL));
        printf("WROTE %ld\n", n);
        fflush(stdout);
        sleep_ms(20);
    }
}
