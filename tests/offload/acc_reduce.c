/* OpenACC reductions and explicit data movement (the EPCC level-1 kind of directives).
 *
 * x (N ints) and y (N doubles) are put on the device by `enter data copyin`; sum, max and min
 * reductions run over `present` data; then the host changes the first half of x and pushes it
 * with `update device(x[0:N/2])`, the device doubles y in place and the host fetches it with
 * `update host(y[0:N])`, and the reductions run again; `exit data delete` frees the device
 * copies. The values are integers (sums below 2^53), so every result is exact and equal to
 * the CPU's, whatever order the device reduces in. acc_malloc / acc_memcpy_to_device /
 * acc_memcpy_from_device / acc_free and a `deviceptr` region cover the runtime API. */
#define PROG "acc_reduce"
#include "offload_check.h"
#include <openacc.h>
#include <stdint.h>

#ifndef N
#define N (1 << 24)
#endif

static void host_reduce(const int *x, const double *y, size_t n, long long *sum, int *mx,
                        int *mn, double *ysum, double *ymax) {
    long long s = 0;
    int a = x[0], b = x[0];
    double ys = 0, ym = y[0];
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        a = x[i] > a ? x[i] : a;
        b = x[i] < b ? x[i] : b;
        ys += y[i];
        ym = y[i] > ym ? y[i] : ym;
    }
    *sum = s, *mx = a, *mn = b, *ysum = ys, *ymax = ym;
}

/* The reductions on the device, over the present copies; returns the kernel time in ms. */
static double device_reduce(const int *x, const double *y, size_t n, long long *sum, int *mx,
                            int *mn, double *ysum, double *ymax) {
    long long s = 0;
    int a = -2147483647 - 1, b = 2147483647;
    double ys = 0, ym = -1e300;
    double t = now_ms();
#pragma acc parallel loop present(x[0:n], y[0:n]) reduction(+:s, ys) reduction(max:a, ym) \
    reduction(min:b)
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        a = x[i] > a ? x[i] : a;
        b = x[i] < b ? x[i] : b;
        ys += y[i];
        ym = y[i] > ym ? y[i] : ym;
    }
    t = now_ms() - t;
    *sum = s, *mx = a, *mn = b, *ysum = ys, *ymax = ym;
    return t;
}

static void check_round(const char *round, const int *x, const double *y, size_t n,
                        double *kernel_ms) {
    long long s, hs;
    int a, b, ha, hb;
    double ys, ym, hys, hym;
    *kernel_ms += device_reduce(x, y, n, &s, &a, &b, &ys, &ym);
    host_reduce(x, y, n, &hs, &ha, &hb, &hys, &hym);
    printf("CHECK %s_int_sum_max_min %lld %d %d\n", round, s, a, b);
    printf("CHECK %s_double_sum_max %.1f %.1f\n", round, ys, ym);
    EXPECT(s == hs && a == ha && b == hb, "%s: device int sum/max/min %lld %d %d, host %lld %d %d",
           round, s, a, b, hs, ha, hb);
    EXPECT(ys == hys && ym == hym, "%s: device double sum/max %.1f %.1f, host %.1f %.1f", round,
           ys, ym, hys, hym);
}

int main(void) {
    size_t n = N;
    int *x = malloc(n * sizeof(int));
    double *y = malloc(n * sizeof(double));
    EXPECT(x && y, "out of host memory");
    for (size_t i = 0; i < n; i++) {
        x[i] = (int)((i * 2654435761u) % 2001) - 1000;
        y[i] = (double)(i % 1000);
    }

    double t0 = now_ms();
    int on_device = 0;
#pragma acc parallel num_gangs(1) copyout(on_device)
    on_device = !acc_on_device(acc_device_host);
    report_time("init", now_ms() - t0);
    report_offloaded(on_device);

    double kernel_ms = 0, t = now_ms();
#pragma acc enter data copyin(x[0:n], y[0:n])
    report_time("enter_data_copyin", now_ms() - t);
    EXPECT(acc_is_present(x, n * sizeof(int)) && acc_is_present(y, n * sizeof(double)),
           "x and y not present after enter data");

    check_round("round1", x, y, n, &kernel_ms);

    /* Host changes the first half of x; only that half goes to the device. */
    for (size_t i = 0; i < n / 2; i++) x[i] = (int)(i % 3001) - 1500;
    t = now_ms();
#pragma acc update device(x[0:n/2])
    report_time("update_device_half", now_ms() - t);

    /* The device doubles y in place; the host fetches it. */
#pragma acc parallel loop present(y[0:n])
    for (size_t i = 0; i < n; i++) y[i] = 2.0 * y[i] + 1.0;
    t = now_ms();
#pragma acc update host(y[0:n])
    report_time("update_host", now_ms() - t);
    for (size_t i = 0; i < n; i += n / 7)
        EXPECT(y[i] == 2.0 * (double)(i % 1000) + 1.0, "y[%zu] = %.1f after update host", i, y[i]);

    check_round("round2", x, y, n, &kernel_ms);
    report_time("reductions", kernel_ms);

#pragma acc exit data delete(x[0:n], y[0:n])

    /* The runtime API: acc_malloc, acc_memcpy_to/from_device, deviceptr. */
    size_t m = 1 << 20;
    int *h = malloc(m * sizeof(int));
    EXPECT(h != NULL, "out of host memory");
    for (size_t i = 0; i < m; i++) h[i] = (int)(i % 100);
    int *d = acc_malloc(m * sizeof(int));
    EXPECT(d != NULL, "acc_malloc failed");
    acc_memcpy_to_device(d, h, m * sizeof(int));
    long long ds = 0;
#pragma acc parallel loop deviceptr(d) reduction(+:ds)
    for (size_t i = 0; i < m; i++) {
        d[i] = d[i] * 3;
        ds += d[i];
    }
    acc_memcpy_from_device(h, d, m * sizeof(int));
    acc_free(d);
    long long hs = 0;
    for (size_t i = 0; i < m; i++) hs += h[i];
    printf("CHECK deviceptr_sum %lld %lld\n", ds, hs);
    EXPECT(ds == hs && h[m - 1] == (int)((m - 1) % 100) * 3, "deviceptr: device sum %lld, host %lld",
           ds, hs);
    free(x), free(y), free(h);
    printf("PASS " PROG "\n");
    return 0;
}
