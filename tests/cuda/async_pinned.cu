// async_pinned: page-locked host memory (cudaMallocHost, cudaHostAlloc), cudaMemcpyAsync in
// and out in 8 chunks with a kernel per chunk over 2 streams, cudaStreamSynchronize; a
// cudaMemcpyAsync from and to pageable memory; cudaMemcpy and cudaMemcpyAsync device to device;
// then, in its own section, pitched memory: cudaMallocPitch, cudaMemcpy2D, cudaMemset2D and
// cudaMemcpy2DAsync.
//
//   nvcc -O2 -o async_pinned async_pinned.cu && ./async_pinned
//
// Prints `CHECK <name> <values>` lines, then `PASS async_pinned`, or `FAIL async_pinned: why`
// (`FAIL async_pinned: memcpy2d ...` for the pitched section) and exit status 1.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PROG "async_pinned"
#include "check.h"
// The pitched (2D) section's checks: their failures name the section.
#define CK2D(call) CK_WHAT("memcpy2d ", call)

#define NCHUNKS 8
#define NSTREAMS 2

// out = in * in * 0.5 + in + chunk: the chunk index makes a misplaced chunk visible.
__global__ void transform(const float *in, float *out, int n, float chunk) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = in[i];
        out[i] = v * v * 0.5f + v + chunk;
    }
}

// Adds row * 1000 + col to every element of a pitched width x height array.
__global__ void add_coords(float *p, size_t pitch, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) {
        float *row = (float *)((char *)p + y * pitch);
        row[x] += (float)(y * 1000 + x);
    }
}

static float input_value(int i) { return (float)((i * 37) % 2003) / 2003.0f - 0.5f; }

static bool approx_eq(float got, float ref) {
    return std::fabs(got - ref) <= 1e-5f * (std::fabs(ref) + 1.0f);
}

static int pitched_section();
static int stream_ordered_section();

int main() {
    CK(cudaSetDevice(0));
    const int chunk = 1 << 20;
    const int n = chunk * NCHUNKS;
    const size_t bytes = (size_t)n * sizeof(float);

    // --- pinned buffers, 8 chunks over 2 streams
    float *h_in, *h_out;
    CK(cudaMallocHost(&h_in, bytes));
    CK(cudaHostAlloc(&h_out, bytes, cudaHostAllocDefault));
    for (int i = 0; i < n; ++i) h_in[i] = input_value(i);
    for (int i = 0; i < n; ++i) h_out[i] = -12345.0f;
    float *d_in, *d_out;
    CK(cudaMalloc(&d_in, bytes));
    CK(cudaMalloc(&d_out, bytes));
    cudaStream_t s[NSTREAMS];
    for (int i = 0; i < NSTREAMS; ++i) CK(cudaStreamCreate(&s[i]));

    const int threads = 256, blocks = (chunk + threads - 1) / threads;
    for (int c = 0; c < NCHUNKS; ++c) {
        cudaStream_t st = s[c % NSTREAMS];
        const size_t off = (size_t)c * chunk;
        CK(cudaMemcpyAsync(d_in + off, h_in + off, chunk * sizeof(float), cudaMemcpyHostToDevice,
                           st));
        transform<<<blocks, threads, 0, st>>>(d_in + off, d_out + off, chunk, (float)c);
        CK(cudaGetLastError());
        CK(cudaMemcpyAsync(h_out + off, d_out + off, chunk * sizeof(float),
                           cudaMemcpyDeviceToHost, st));
    }
    for (int i = 0; i < NSTREAMS; ++i) CK(cudaStreamSynchronize(s[i]));

    double sum = 0;
    for (int i = 0; i < n; ++i) {
        const float v = h_in[i];
        const float ref = v * v * 0.5f + v + (float)(i / chunk);
        if (!approx_eq(h_out[i], ref)) {
            printf("FAIL " PROG ": chunked element %d = %.9g, expected %.9g\n", i, h_out[i], ref);
            return 1;
        }
        sum += h_out[i];
    }
    printf("CHECK chunked_sum %.6e\n", sum);
    printf("CHECK chunked_elems %.6e %.6e %.6e\n", h_out[5], h_out[3 * chunk + 11], h_out[n - 1]);

    // --- pageable memory through cudaMemcpyAsync (the copy is staged; results must be equal)
    const int pn = 3 * chunk + 17;  // not a multiple of anything
    std::vector<float> pg_in(pn), pg_out(pn, 0.0f);
    for (int i = 0; i < pn; ++i) pg_in[i] = input_value(i) * 3.0f;
    CK(cudaMemcpyAsync(d_in, pg_in.data(), pn * sizeof(float), cudaMemcpyHostToDevice, s[0]));
    transform<<<(pn + threads - 1) / threads, threads, 0, s[0]>>>(d_in, d_out, pn, 0.0f);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(pg_out.data(), d_out, pn * sizeof(float), cudaMemcpyDeviceToHost, s[0]));
    CK(cudaStreamSynchronize(s[0]));
    double psum = 0;
    for (int i = 0; i < pn; ++i) {
        const float v = pg_in[i];
        const float ref = v * v * 0.5f + v;
        if (!approx_eq(pg_out[i], ref)) {
            printf("FAIL " PROG ": pageable element %d = %.9g, expected %.9g\n", i, pg_out[i],
                   ref);
            return 1;
        }
        psum += pg_out[i];
    }
    printf("CHECK pageable_sum %.6e\n", psum);

    // --- device to device: cudaMemcpy of the whole output, cudaMemcpyAsync of a slice
    float *d_copy;
    CK(cudaMalloc(&d_copy, bytes));
    CK(cudaMemcpy(d_in, h_in, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_copy, d_in, bytes, cudaMemcpyDeviceToDevice));
    const size_t slice_off = 1000, slice_len = 5000;  // d_copy[0..] = d_in[1000..6000]
    CK(cudaMemcpyAsync(d_copy, d_in + slice_off, slice_len * sizeof(float),
                       cudaMemcpyDeviceToDevice, s[1]));
    CK(cudaStreamSynchronize(s[1]));
    CK(cudaMemcpy(h_out, d_copy, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        const float ref = (size_t)i < slice_len ? h_in[slice_off + i] : h_in[i];
        if (h_out[i] != ref) {
            printf("FAIL " PROG ": device-to-device element %d = %.9g, expected %.9g\n", i,
                   h_out[i], ref);
            return 1;
        }
    }
    printf("CHECK d2d_elems %.6e %.6e\n", h_out[0], h_out[n - 1]);

    for (int i = 0; i < NSTREAMS; ++i) CK(cudaStreamDestroy(s[i]));
    CK(cudaFree(d_copy));
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    CK(cudaFreeHost(h_in));
    CK(cudaFreeHost(h_out));

    if (pitched_section() != 0) return 1;
    if (stream_ordered_section() != 0) return 1;
    printf("PASS " PROG "\n");
    return 0;
}

// --- pitched memory: cudaMallocPitch, cudaMemcpy2D in and out, cudaMemset2D, a kernel
// indexing by pitch, cudaMemcpy2DAsync of a sub-rectangle. Failures say `memcpy2d`.
static int pitched_section() {
    const int width = 1000, height = 513;  // rows of 4000 bytes: the pitch pads them
    std::vector<float> host((size_t)width * height), back((size_t)width * height);
    for (size_t i = 0; i < host.size(); ++i) host[i] = input_value((int)i);

    float *d;
    size_t pitch = 0;
    CK2D(cudaMallocPitch((void **)&d, &pitch, width * sizeof(float), height));
    if (pitch < width * sizeof(float)) {
        printf("FAIL " PROG ": memcpy2d pitch %zu < row size %zu\n", pitch, width * sizeof(float));
        return 1;
    }
    printf("pitch %zu bytes for rows of %zu bytes\n", pitch, width * sizeof(float));

    // cudaMemset2D zeroes it, then the host matrix goes in row by row.
    CK2D(cudaMemset2D(d, pitch, 0, width * sizeof(float), height));
    CK2D(cudaMemcpy2D(d, pitch, host.data(), width * sizeof(float), width * sizeof(float), height,
                      cudaMemcpyHostToDevice));
    dim3 block(32, 8), grid((width + 31) / 32, (height + 7) / 8);
    add_coords<<<grid, block>>>(d, pitch, width, height);
    CK2D(cudaGetLastError());
    CK2D(cudaDeviceSynchronize());
    CK2D(cudaMemcpy2D(back.data(), width * sizeof(float), d, pitch, width * sizeof(float), height,
                      cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x) {
            const size_t i = (size_t)y * width + x;
            const float ref = host[i] + (float)(y * 1000 + x);
            if (back[i] != ref) {
                printf("FAIL " PROG ": memcpy2d element (%d,%d) = %.9g, expected %.9g\n", y, x,
                       back[i], ref);
                return 1;
            }
            sum += back[i];
        }
    printf("CHECK pitched_sum %.6e\n", sum);

    // A 100 x 50 sub-rectangle starting at row 7, column 13, into a tight host array (async).
    const int sw = 100, sh = 50, sy = 7, sx = 13;
    std::vector<float> sub((size_t)sw * sh, 0.0f);
    cudaStream_t st;
    CK2D(cudaStreamCreate(&st));
    const char *corner = (const char *)d + sy * pitch + sx * sizeof(float);
    CK2D(cudaMemcpy2DAsync(sub.data(), sw * sizeof(float), corner, pitch, sw * sizeof(float), sh,
                           cudaMemcpyDeviceToHost, st));
    CK2D(cudaStreamSynchronize(st));
    CK2D(cudaStreamDestroy(st));
    for (int y = 0; y < sh; ++y)
        for (int x = 0; x < sw; ++x) {
            const float ref = back[(size_t)(sy + y) * width + sx + x];
            if (sub[(size_t)y * sw + x] != ref) {
                printf("FAIL " PROG ": memcpy2d sub-rectangle (%d,%d) = %.9g, expected %.9g\n", y,
                       x, sub[(size_t)y * sw + x], ref);
                return 1;
            }
        }
    printf("CHECK pitched_sub %.6e %.6e\n", sub[0], sub[sub.size() - 1]);
    CK2D(cudaFree(d));
    return 0;
}

// --- stream-ordered allocation: cudaMallocAsync / cudaFreeAsync from the default pool, used
// on the stream between them. Failures say `mallocasync`.
#define CKA(call) CK_WHAT("mallocasync ", call)

static int stream_ordered_section() {
    const int n = 1 << 20;
    cudaStream_t stream;
    CKA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<float> host(n), back(n);
    for (int i = 0; i < n; ++i) host[i] = input_value(i);
    float *a = nullptr, *b = nullptr;
    CKA(cudaMallocAsync((void **)&a, n * sizeof(float), stream));
    CKA(cudaMallocAsync((void **)&b, n * sizeof(float), stream));
    CKA(cudaMemcpyAsync(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
    CKA(cudaMemsetAsync(b, 0, n * sizeof(float), stream));
    CKA(cudaMemcpyAsync(b, a, n / 2 * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    CKA(cudaMemcpyAsync(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CKA(cudaFreeAsync(a, stream));
    CKA(cudaFreeAsync(b, stream));
    CKA(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i) {
        float want = i < n / 2 ? host[i] : 0.0f;
        if (back[i] != want) {
            printf("FAIL " PROG ": mallocasync element %d = %g, want %g\n", i, back[i], want);
            return 1;
        }
    }
    printf("CHECK mallocasync %.6e %.6e\n", back[1], back[n / 2 - 1]);
    CKA(cudaStreamDestroy(stream));
    return 0;
}
