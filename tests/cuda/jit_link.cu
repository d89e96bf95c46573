// jit_link: the driver's JIT compiler and linker, as GCC's OpenACC/OpenMP runtime, Numba and
// JIT-based libraries use them: PTX linked with cuLinkCreate/cuLinkAddData/cuLinkComplete (info
// log, error log and wall time asked for), the cubin loaded with cuModuleLoadData; the same PTX
// written to a file and loaded with cuModuleLoad and cuLinkAddFile; bad PTX refused with an error
// log; cuModuleLoadDataEx with JIT options; PTX newer than the driver refused with the driver's
// own error. The kernels run and are checked against the CPU.
//
//   nvcc -O2 -o jit_link jit_link.cu -lcuda && ./jit_link
//
// Prints `CHECK` lines, then `PASS jit_link`, or `FAIL jit_link: why` and exit status 1.
#include <cuda.h>
#include <cstdio>
#include <cstring>
#include <vector>

#define PROG "jit_link"
#include "check.h"


// add_one(float *p, int n): p[i] += 1.
static const char *kPtx =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<6>;\n"
    "  .reg .f32 %f<3>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r2, [n];\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r4, %ntid.x;\n"
    "  mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.s32 %p1, %r1, %r2;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.s32 %rd3, %r1, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.f32 %f1, [%rd4];\n"
    "  add.f32 %f2, %f1, 0f3F800000;\n"
    "  st.global.f32 [%rd4], %f2;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

static void run(CUmodule module, CUdeviceptr d, int n, std::vector<float> &host) {
    CUfunction f;
    CU(cuModuleGetFunction(&f, module, "add_one"));
    CUmodule owner = nullptr;
    CU(cuFuncGetModule(&owner, f));
    EXPECT(owner == module, "cuFuncGetModule gave another module");
    void *args[] = {&d, &n};
    CU(cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(host.data(), d, n * sizeof(float)));
}

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    const int n = 1000;
    std::vector<float> host(n, 0.0f);
    CUdeviceptr d;
    CU(cuMemAlloc(&d, n * sizeof(float)));
    CU(cuMemsetD32(d, 0, n));

    // Link PTX, with logs and wall time asked for.
    char info[4096] = {0}, error[4096] = {0};
    float wall = -1.0f;
    CUjit_option opts[] = {CU_JIT_WALL_TIME, CU_JIT_INFO_LOG_BUFFER,
                           CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                           CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE};
    void *vals[] = {nullptr, info, (void *)(size_t)sizeof(info), error,
                    (void *)(size_t)sizeof(error), (void *)1};
    CUlinkState link;
    CU(cuLinkCreate(6, opts, vals, &link));
    CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)kPtx, strlen(kPtx) + 1, "add_one.ptx", 0,
                     nullptr, nullptr));
    void *cubin;
    size_t cubin_size;
    CU(cuLinkComplete(link, &cubin, &cubin_size));
    memcpy(&wall, &vals[0], sizeof(float));
    EXPECT(cubin_size > 0 && memcmp(cubin, "\x7f" "ELF", 4) == 0, "linked image is no ELF cubin");
    EXPECT(strstr(info, "add_one") != nullptr, "verbose info log names no kernel: [%s]", info);
    EXPECT(wall >= 0.0f, "wall time %g", wall);
    printf("info log: %s\n", info);
    CUmodule linked;
    CU(cuModuleLoadData(&linked, cubin));
    CU(cuLinkDestroy(link));
    run(linked, d, n, host);
    EXPECT(host[0] == 1.0f && host[n - 1] == 1.0f, "linked kernel: %g", host[0]);
    printf("CHECK linked %.6e %d\n", host[n - 1], (int)(info[0] != 0));

    // The PTX from a file: cuModuleLoad, and cuLinkAddFile.
    const char *path = "/tmp/rgpu-jit-link-add-one.ptx";
    FILE *file = fopen(path, "w");
    EXPECT(file != nullptr, "cannot write %s", path);
    fputs(kPtx, file);
    fclose(file);
    CUmodule from_file;
    CU(cuModuleLoad(&from_file, path));
    run(from_file, d, n, host);
    EXPECT(host[5] == 2.0f, "module from a file: %g", host[5]);
    CU(cuLinkCreate(0, nullptr, nullptr, &link));
    CU(cuLinkAddFile(link, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr));
    CU(cuLinkComplete(link, &cubin, &cubin_size));
    CUmodule linked_file;
    CU(cuModuleLoadData(&linked_file, cubin));
    CU(cuLinkDestroy(link));
    run(linked_file, d, n, host);
    EXPECT(host[5] == 3.0f, "linked file: %g", host[5]);
    printf("CHECK from_file %.6e\n", host[5]);
    CUresult missing = cuModuleLoad(&from_file, "/nonexistent/rgpu.ptx");
    EXPECT(missing == CUDA_ERROR_FILE_NOT_FOUND, "missing file -> %d", (int)missing);

    // Bad PTX: refused, with the compiler's error in the error log.
    memset(error, 0, sizeof(error));
    CUjit_option eopts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_OPTIMIZATION_LEVEL};
    void *evals[] = {error, (void *)(size_t)sizeof(error), (void *)3};
    CUmodule bad;
    const char *bad_ptx = ".version 7.0\n.target sm_80\n.address_size 64\nthis is not ptx\n";
    CUresult refused = cuModuleLoadDataEx(&bad, bad_ptx, 3, eopts, evals);
    EXPECT(refused != CUDA_SUCCESS, "bad PTX was loaded");
    EXPECT(error[0] != 0, "no error log for bad PTX");
    printf("error log: %s\n", error);
    printf("CHECK bad_ptx %d\n", (int)(refused == CUDA_ERROR_INVALID_PTX));
    // PTX newer than the driver (a client built with a newer toolkit than the server's
    // driver): the driver's own CUDA_ERROR_UNSUPPORTED_PTX_VERSION, and the session goes on.
    const char *future_ptx = ".version 9.9\n.target sm_80\n.address_size 64\n"
                             ".visible .entry f() { ret; }\n";
    CUmodule future;
    CUresult skew = cuModuleLoadData(&future, future_ptx);
    EXPECT(skew == CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "PTX 9.9 -> %d", (int)skew);
    printf("CHECK future_ptx %d\n", (int)skew);
    // Good PTX with options.
    CUmodule tuned;
    CUjit_option topts[] = {CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_MAX_REGISTERS};
    void *tvals[] = {(void *)2, (void *)32};
    CU(cuModuleLoadDataEx(&tuned, kPtx, 2, topts, tvals));
    run(tuned, d, n, host);
    EXPECT(host[9] == 4.0f, "tuned module: %g", host[9]);
    printf("CHECK tuned %.6e\n", host[9]);

    CU(cuModuleUnload(tuned));
    CU(cuModuleUnload(linked_file));
    CU(cuModuleUnload(from_file));
    CU(cuModuleUnload(linked));
    CU(cuMemFree(d));
    CU(cuDevicePrimaryCtxRelease(dev));
    printf("PASS jit_link\n");
    return 0;
}
