/* OpenACC matrix multiply (the seed's kind of kernel: EPCC level 2 / CloverLeaf style
 * directives), built with gcc-12 -fopenacc -foffload=nvptx-none by scripts/build-offload.sh.
 *
 * C = A * B for 1024x1024 floats inside one `data` region (copyin A, B; copyout C): a warm-up
 * region first (loads the PTX image: cuLinkCreate/AddData/Complete + cuModuleLoadData), then
 * REPS timed `parallel loop gang` / `loop vector` kernels over `present` data. Inputs are
 * small integers, so every element is exact in float and equal to the CPU reference. */
#define PROG "acc_matmul"
#include "offload_check.h"
#include <openacc.h>

#ifndef N
#define N 1024
#endif
#define REPS 5

int main(void) {
    size_t n = N;
    float *A = malloc(n * n * sizeof(float));
    float *B = malloc(n * n * sizeof(float));
    float *C = malloc(n * n * sizeof(float));
    float *R = calloc(n * n, sizeof(float));
    EXPECT(A && B && C && R, "out of host memory");
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            A[i * n + j] = (float)((int)((i * 7 + j * 3) % 17) - 8);
            B[i * n + j] = (float)((int)((i * 5 + j * 11) % 13) - 6);
            C[i * n + j] = -1.0f;
        }

    int ndev = acc_get_num_devices(acc_device_not_host);
    printf("devices %d (acc_device_not_host)\n", ndev);

    double t0 = now_ms();
    int on_device = 0;
#pragma acc parallel num_gangs(1) copyout(on_device)
    on_device = !acc_on_device(acc_device_host);
    report_time("init", now_ms() - t0);
    report_offloaded(on_device);
    if (on_device) {
        const char *name = acc_get_property_string(0, acc_device_not_host, acc_property_name);
        printf("device %s\n", name ? name : "?");
    }

    double kernel_ms = 0, t_data = now_ms();
#pragma acc data copyin(A[0:n*n], B[0:n*n]) copyout(C[0:n*n])
    {
        for (int rep = 0; rep < REPS; rep++) {
            double t = now_ms();
#pragma acc parallel loop gang present(A[0:n*n], B[0:n*n], C[0:n*n])
            for (size_t i = 0; i < n; i++) {
#pragma acc loop vector
                for (size_t j = 0; j < n; j++) {
                    float s = 0.0f;
                    for (size_t k = 0; k < n; k++) s += A[i * n + k] * B[k * n + j];
                    C[i * n + j] = s;
                }
            }
            double ms = now_ms() - t;
            if (rep > 0 || REPS == 1) kernel_ms += ms; /* the first also pays any lazy setup */
        }
    }
    double data_ms = now_ms() - t_data;
    report_time("kernel_avg", kernel_ms / (REPS > 1 ? REPS - 1 : 1));
    report_time("data_region_total", data_ms);

    /* CPU reference (i-k-j order; exact, the values are small integers). */
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < n; k++) {
            float a = A[i * n + k];
            for (size_t j = 0; j < n; j++) R[i * n + j] += a * B[k * n + j];
        }
    double err = max_rel_diff_f(C, R, n * n);
    printf("CHECK matmul_n %zu\n", n);
    printf("CHECK matmul_checksum %.1f\n", sum_f(C, n * n));
    printf("CHECK matmul_samples %.1f %.1f %.1f %.1f %.1f\n", C[0], C[1], C[n + 1],
           C[(n / 2) * n + n / 3], C[n * n - 1]);
    printf("CHECK matmul_max_rel_err_vs_cpu %g\n", err);
    EXPECT(err == 0, "C differs from the CPU reference (max relative difference %g)", err);
    free(A), free(B), free(C), free(R);
    printf("PASS " PROG "\n");
    return 0;
}
