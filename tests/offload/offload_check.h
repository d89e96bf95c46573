/* The checks the offload programs in tests/offload share (C, for gcc -fopenacc / -fopenmp).
 * Define PROG (the program's name) first. Output follows tests/cuda: `CHECK <name> <values>`
 * lines compared between a native run and an rgpu run by tests/cuda/compare.py, `PASS <PROG>`
 * at the end; a failed check prints `FAIL <PROG>: ...` and exits 1. Timings are printed as
 * `TIME <PROG> <what> <ms> ms` (not compared, shown side by side by gpu-offload-check.sh). */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>

#define EXPECT(cond, ...)                          \
    do {                                           \
        if (!(cond)) {                             \
            printf("FAIL " PROG ": " __VA_ARGS__); \
            printf("\n");                          \
            fflush(stdout);                        \
            exit(1);                               \
        }                                          \
    } while (0)

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void report_time(const char *what, double ms) {
    printf("TIME " PROG " %s %.3f ms\n", what, ms);
    fflush(stdout);
}

/* Whether a region ran on the accelerator (1) or fell back to the host (0): compared like any
 * other CHECK, and gpu-offload-check.sh requires 1 in the native run. */
static inline void report_offloaded(int on_device) {
    printf("CHECK offloaded %d\n", on_device ? 1 : 0);
    if (!on_device)
        printf("note: " PROG " ran its regions on the host (no offload device)\n");
    fflush(stdout);
}

/* Largest relative difference between two float arrays (0 when equal). */
static inline double max_rel_diff_f(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
        double r = m > 0 ? d / m : d;
        if (r > worst || r != r) worst = r != r ? INFINITY : r;
    }
    return worst;
}

static inline double sum_f(const float *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i];
    return s;
}
