/* OpenACC 2-D Jacobi (5-point stencil) - the seed's Himeno/LE2D kind of kernel.
 *
 * A (N x N floats, fixed boundary) lives on the device for the whole solve in a
 * `data copy(A) create(Anew)` region. Each iteration: a synchronous `parallel loop` over
 * `present` data computes Anew and the error with `reduction(max:err)`; then Anew is copied
 * back into A by two kernels on two async queues (top half on queue 1, bottom half on queue 2),
 * every 100 iterations a row of A is fetched with `update self(...) async(1)`, and
 * `wait(1, 2)` joins the queues. It stops at the tolerance or after ITERS iterations; the same
 * computation on the CPU is the reference (the same float operations, so equal bit for bit
 * unless the device contracts them; checked with a relative tolerance of 1e-5). */
#define PROG "acc_jacobi"
#include "offload_check.h"
#include <openacc.h>
#include <string.h>

#ifndef N
#define N 1024
#endif
#ifndef ITERS
#define ITERS 1000
#endif
#define TOL 1e-6f

static void init(float *A, size_t n) {
    memset(A, 0, n * n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        A[0 * n + i] = 1.0f;                       /* top edge */
        A[i * n + 0] = (float)i / (float)(n - 1);  /* left edge: a ramp */
    }
}

int main(void) {
    size_t n = N;
    float *A = malloc(n * n * sizeof(float)), *Anew = malloc(n * n * sizeof(float));
    float *R = malloc(n * n * sizeof(float)), *Rnew = malloc(n * n * sizeof(float));
    float *row = malloc(n * sizeof(float));
    EXPECT(A && Anew && R && Rnew && row, "out of host memory");
    init(A, n);
    memcpy(Anew, A, n * n * sizeof(float));
    init(R, n);
    memcpy(Rnew, R, n * n * sizeof(float));

    double t0 = now_ms();
    int on_device = 0;
#pragma acc parallel num_gangs(1) copyout(on_device)
    on_device = !acc_on_device(acc_device_host);
    report_time("init", now_ms() - t0);
    report_offloaded(on_device);

    float err = 1.0f;
    int iter = 0;
    double row_sum = 0;
    size_t half = n / 2, mid = n / 2;
    double t_solve = now_ms();
#pragma acc data copy(A[0:n*n]) copyin(Anew[0:n*n])
    {
        while (err > TOL && iter < ITERS) {
            err = 0.0f;
#pragma acc parallel loop gang present(A[0:n*n], Anew[0:n*n]) reduction(max:err)
            for (size_t i = 1; i < n - 1; i++) {
#pragma acc loop vector reduction(max:err)
                for (size_t j = 1; j < n - 1; j++) {
                    float v = 0.25f * (A[(i - 1) * n + j] + A[(i + 1) * n + j] +
                                       A[i * n + j - 1] + A[i * n + j + 1]);
                    float d = v - A[i * n + j];
                    d = d < 0.0f ? -d : d;
                    Anew[i * n + j] = v;
                    err = d > err ? d : err;
                }
            }
#pragma acc parallel loop gang present(A[0:n*n], Anew[0:n*n]) async(1)
            for (size_t i = 1; i < half; i++) {
#pragma acc loop vector
                for (size_t j = 1; j < n - 1; j++) A[i * n + j] = Anew[i * n + j];
            }
#pragma acc parallel loop gang present(A[0:n*n], Anew[0:n*n]) async(2)
            for (size_t i = half; i < n - 1; i++) {
#pragma acc loop vector
                for (size_t j = 1; j < n - 1; j++) A[i * n + j] = Anew[i * n + j];
            }
            if (iter % 100 == 0) {
                /* the row lies in the bottom half: queue 1 must wait for queue 2 first */
#pragma acc wait(2) async(1)
#pragma acc update self(A[mid*n:n]) async(1)
            }
#pragma acc wait(1, 2)
            if (iter % 100 == 0)
                for (size_t j = 0; j < n; j++) row_sum += A[mid * n + j];
            iter++;
        }
    }
    double solve_ms = now_ms() - t_solve;
    report_time("solve_total", solve_ms);
    report_time("per_iteration", solve_ms / (iter ? iter : 1));

    /* The CPU reference: the same iteration. */
    float rerr = 1.0f;
    int riter = 0;
    while (rerr > TOL && riter < ITERS) {
        rerr = 0.0f;
        for (size_t i = 1; i < n - 1; i++)
            for (size_t j = 1; j < n - 1; j++) {
                float v = 0.25f * (R[(i - 1) * n + j] + R[(i + 1) * n + j] + R[i * n + j - 1] +
                                   R[i * n + j + 1]);
                float d = v - R[i * n + j];
                d = d < 0.0f ? -d : d;
                Rnew[i * n + j] = v;
                rerr = d > rerr ? d : rerr;
            }
        for (size_t i = 1; i < n - 1; i++)
            memcpy(&R[i * n + 1], &Rnew[i * n + 1], (n - 2) * sizeof(float));
        riter++;
    }
    double diff = max_rel_diff_f(A, R, n * n);
    printf("CHECK jacobi_n %zu\n", n);
    printf("CHECK jacobi_iterations %d\n", iter);
    printf("CHECK jacobi_final_err %.9g\n", err);
    printf("CHECK jacobi_checksum %.6f\n", sum_f(A, n * n));
    printf("CHECK jacobi_row_history_sum %.6f\n", row_sum);
    printf("CHECK jacobi_samples %.9g %.9g %.9g %.9g\n", A[1 * n + 1], A[10 * n + 20],
           A[mid * n + 3], A[(n - 2) * n + 1]);
    printf("cpu reference: iterations %d, err %.9g, max relative difference %g\n", riter, rerr,
           diff);
    EXPECT(iter == riter, "iterations %d, CPU reference %d", iter, riter);
    EXPECT(diff <= 1e-5, "A differs from the CPU reference (max relative difference %g)", diff);
    free(A), free(Anew), free(R), free(Rnew), free(row);
    printf("PASS " PROG "\n");
    return 0;
}
