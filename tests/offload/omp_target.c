/* OpenMP target offload (gcc-12 -fopenmp -foffload=nvptx-none; libgomp's nvptx plugin).
 *
 *  1. matmul: `target teams distribute parallel for collapse(2)` with map(to:)/map(from:),
 *     1024x1024 floats, integer-valued (exact), timed and checked against the CPU;
 *  2. a `+` reduction and a `max` reduction, each in a `target teams distribute parallel for`;
 *  3. `target data` keeping x on the device across regions, host changes pushed with
 *     `target update to`, device results fetched with `target update from`;
 *  4. two `target ... nowait` regions on disjoint arrays joined by `taskwait`;
 *  5. omp_target_alloc / omp_target_memcpy (host->device, device->device, device->host) /
 *     is_device_ptr / omp_target_free.
 * Every result is exact (integers), so native and rgpu runs agree bit for bit. */
#define PROG "omp_target"
#include "offload_check.h"
#include <omp.h>

#ifndef N
#define N 1024
#endif

int main(void) {
    size_t n = N, nn = (size_t)N * N;
    int dev = omp_get_default_device(), host = omp_get_initial_device();
    printf("devices %d (omp_get_num_devices), default %d, host %d\n", omp_get_num_devices(), dev,
           host);

    double t0 = now_ms();
    int on_device = 0;
#pragma omp target map(from: on_device)
    on_device = !omp_is_initial_device();
    report_time("init", now_ms() - t0);
    report_offloaded(on_device);

    /* 1. matmul */
    float *A = malloc(nn * sizeof(float)), *B = malloc(nn * sizeof(float));
    float *C = malloc(nn * sizeof(float)), *R = calloc(nn, sizeof(float));
    EXPECT(A && B && C && R, "out of host memory");
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            A[i * n + j] = (float)((int)((i * 7 + j * 3) % 17) - 8);
            B[i * n + j] = (float)((int)((i * 5 + j * 11) % 13) - 6);
        }
    double t = now_ms();
#pragma omp target data map(to: A[0:nn], B[0:nn]) map(from: C[0:nn])
    {
        double tk = now_ms();
#pragma omp target teams distribute parallel for collapse(2)
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                float s = 0.0f;
                for (size_t k = 0; k < n; k++) s += A[i * n + k] * B[k * n + j];
                C[i * n + j] = s;
            }
        report_time("matmul_kernel", now_ms() - tk);
    }
    report_time("matmul_with_transfers", now_ms() - t);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < n; k++) {
            float a = A[i * n + k];
            for (size_t j = 0; j < n; j++) R[i * n + j] += a * B[k * n + j];
        }
    double err = max_rel_diff_f(C, R, nn);
    printf("CHECK matmul_checksum %.1f\n", sum_f(C, nn));
    printf("CHECK matmul_samples %.1f %.1f %.1f\n", C[0], C[n + 1], C[nn - 1]);
    EXPECT(err == 0, "matmul differs from the CPU reference (max relative difference %g)", err);

    /* 2. reductions */
    size_t m = 1 << 24;
    int *x = malloc(m * sizeof(int));
    EXPECT(x != NULL, "out of host memory");
    for (size_t i = 0; i < m; i++) x[i] = (int)((i * 2654435761u) % 2001) - 1000;
    long long sum = 0, hsum = 0;
    int mx = -2147483647 - 1, hmx = x[0];
    /* Two regions: one region with both (a long long and an int) makes GCC 12 combine them
     * with a 16-byte compare-and-swap (libatomic's __atomic_compare_exchange_16 on nvptx). */
    t = now_ms();
#pragma omp target teams distribute parallel for map(to: x[0:m]) reduction(+:sum)
    for (size_t i = 0; i < m; i++) sum += x[i];
#pragma omp target teams distribute parallel for map(to: x[0:m]) reduction(max:mx)
    for (size_t i = 0; i < m; i++) mx = x[i] > mx ? x[i] : mx;
    report_time("reductions_with_transfers", now_ms() - t);
    for (size_t i = 0; i < m; i++) hsum += x[i], hmx = x[i] > hmx ? x[i] : hmx;
    printf("CHECK reduction_sum_max %lld %d\n", sum, mx);
    EXPECT(sum == hsum && mx == hmx, "reduction: device %lld %d, host %lld %d", sum, mx, hsum, hmx);

    /* 3. target data + target update */
    long long s1 = 0, s2 = 0;
    t = now_ms();
#pragma omp target data map(tofrom: x[0:m])
    {
#pragma omp target teams distribute parallel for reduction(+:s1)
        for (size_t i = 0; i < m; i++) s1 += x[i];
        for (size_t i = 0; i < m; i += 2) x[i] = 1; /* host only, until the update */
#pragma omp target update to(x[0:m])
#pragma omp target teams distribute parallel for reduction(+:s2)
        for (size_t i = 0; i < m; i++) {
            x[i] = x[i] * 2;
            s2 += x[i];
        }
#pragma omp target update from(x[0:m / 2])
        EXPECT(x[0] == 2 && x[2] == 2, "target update from: x[0] = %d, x[2] = %d", x[0], x[2]);
    }
    report_time("target_data_updates", now_ms() - t);
    long long hs2 = 0;
    for (size_t i = 0; i < m; i++) hs2 += x[i];
    printf("CHECK target_data_sums %lld %lld\n", s1, s2);
    EXPECT(s1 == hsum && s2 == hs2, "target data: sums %lld %lld, expected %lld %lld", s1, s2,
           hsum, hs2);

    /* 4. nowait + taskwait */
    size_t q = 1 << 22;
    double *u = malloc(q * sizeof(double)), *v = malloc(q * sizeof(double));
    EXPECT(u && v, "out of host memory");
    t = now_ms();
#pragma omp target teams distribute parallel for map(from: u[0:q]) nowait
    for (size_t i = 0; i < q; i++) u[i] = (double)(i % 977);
#pragma omp target teams distribute parallel for map(from: v[0:q]) nowait
    for (size_t i = 0; i < q; i++) v[i] = (double)(i % 331) * 2.0;
#pragma omp taskwait
    report_time("nowait_pair", now_ms() - t);
    double us = 0, vs = 0, hus = 0, hvs = 0;
    for (size_t i = 0; i < q; i++)
        us += u[i], vs += v[i], hus += (double)(i % 977), hvs += (double)(i % 331) * 2.0;
    printf("CHECK nowait_sums %.1f %.1f\n", us, vs);
    EXPECT(us == hus && vs == hvs, "nowait: sums %.1f %.1f, expected %.1f %.1f", us, vs, hus, hvs);

    /* 5. omp_target_alloc / omp_target_memcpy / is_device_ptr */
    size_t k = 1 << 20;
    int *h = malloc(k * sizeof(int)), *back = malloc(k * sizeof(int));
    EXPECT(h && back, "out of host memory");
    for (size_t i = 0; i < k; i++) h[i] = (int)(i % 100);
    int *d1 = omp_target_alloc(k * sizeof(int), dev), *d2 = omp_target_alloc(k * sizeof(int), dev);
    EXPECT(d1 && d2, "omp_target_alloc failed");
    t = now_ms();
    EXPECT(omp_target_memcpy(d1, h, k * sizeof(int), 0, 0, dev, host) == 0, "memcpy h->d");
    EXPECT(omp_target_memcpy(d2, d1, k * sizeof(int), 0, 0, dev, dev) == 0, "memcpy d->d");
    long long ds = 0;
#pragma omp target teams distribute parallel for is_device_ptr(d2) reduction(+:ds)
    for (size_t i = 0; i < k; i++) {
        d2[i] += 7;
        ds += d2[i];
    }
    EXPECT(omp_target_memcpy(back, d2, k * sizeof(int), 0, 0, host, dev) == 0, "memcpy d->h");
    report_time("target_alloc_memcpy", now_ms() - t);
    omp_target_free(d1, dev);
    omp_target_free(d2, dev);
    long long hds = 0;
    for (size_t i = 0; i < k; i++) {
        EXPECT(back[i] == (int)(i % 100) + 7, "omp_target_memcpy: back[%zu] = %d", i, back[i]);
        hds += back[i];
    }
    printf("CHECK target_alloc_sum %lld\n", ds);
    EXPECT(ds == hds, "is_device_ptr: sum %lld, expected %lld", ds, hds);

    free(A), free(B), free(C), free(R), free(x), free(u), free(v), free(h), free(back);
    printf("PASS " PROG "\n");
    return 0;
}
