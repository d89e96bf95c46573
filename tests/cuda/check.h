// The checks every program in tests/cuda shares. Define PROG (the program's name) first.
// A failed check prints `FAIL <PROG>: ...` (the line gpu-check.sh reports) and exits 1.
#pragma once
#include <cstdio>
#include <cstdlib>

// A CUDA runtime call that must succeed; `what` prefixes the message (e.g. a section name).
#define CK_WHAT(what, call)                                                               \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            printf("FAIL " PROG ": %s%s:%d: %s -> %s (%s)\n", what, __FILE__, __LINE__,     \
                   #call, cudaGetErrorName(e_), cudaGetErrorString(e_));                  \
            fflush(stdout);                                                               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define CK(call) CK_WHAT("", call)

// After a kernel launch: launch errors, then (with the sync) execution errors.
#define CK_LAUNCH()                  \
    do {                             \
        CK(cudaGetLastError());      \
        CK(cudaDeviceSynchronize()); \
    } while (0)

// A condition that must hold; the rest is a printf format and its arguments.
#define EXPECT(cond, ...)                          \
    do {                                           \
        if (!(cond)) {                             \
            printf("FAIL " PROG ": " __VA_ARGS__); \
            printf("\n");                          \
            fflush(stdout);                        \
            exit(1);                               \
        }                                          \
    } while (0)

// A driver API call that must succeed (programs that include cuda.h).
#ifdef __cuda_cuda_h__
#define CU(call)                                                                          \
    do {                                                                                  \
        CUresult r_ = (call);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                         \
            const char *name_ = "?";                                                      \
            cuGetErrorName(r_, &name_);                                                   \
            printf("FAIL " PROG ": %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, name_); \
            fflush(stdout);                                                               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#endif
