// copies: the copies and memsets beyond 1D. 2D: cudaMemset2D, cudaMemcpy2D between pitched
// host rows and cudaMallocPitch memory (with an x offset), cudaMemcpy2DAsync device to device.
// 3D: cudaMalloc3D, cudaMemset3D, cudaMemcpy3D of a box with offsets host to device, device to
// device and device to host. Peer: between the first and the last device the program sees
// (through rgpu over two servers: GPUs of different servers, relayed by the client; natively
// with one GPU: the same device) with cudaMemcpyPeer, cudaMemcpyPeerAsync, cudaMemcpy3DPeer
// and cudaMemcpy with cudaMemcpyDefault.
//
//   nvcc -O2 -o copies copies.cu && ./copies
//
// Prints `devices N`, `CHECK` lines that do not depend on N, then `PASS copies`.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define PROG "copies"
#include "check.h"

typedef unsigned char byte;

// A byte that differs between neighbouring rows, columns and slices.
static byte pattern(size_t x, size_t y, size_t z) { return (byte)(x * 7 + y * 13 + z * 31 + 1); }

// Sum of bytes weighted by position, so misplaced bytes change it.
static unsigned long long weighted(const byte *p, size_t n) {
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum += (unsigned long long)p[i] * (i % 1013 + 1);
    return sum;
}

// ---- 2D -----------------------------------------------------------------------------------
static void two_d() {
    const size_t width = 1000, height = 37, host_pitch = width + 37, out_pitch = width + 5;
    const size_t skip = 16;  // the first bytes of each device row keep the memset value
    std::vector<byte> host(host_pitch * height), out(out_pitch * height, 0);
    for (size_t y = 0; y < height; y++)
        for (size_t x = 0; x < host_pitch; x++) host[y * host_pitch + x] = pattern(x, y, 0);
    byte *a, *b;
    size_t a_pitch, b_pitch;
    CK(cudaMallocPitch((void **)&a, &a_pitch, width, height));
    CK(cudaMallocPitch((void **)&b, &b_pitch, width, height));
    CK(cudaMemset2D(a, a_pitch, 0xab, width, height));
    CK(cudaMemcpy2D(a + skip, a_pitch, host.data(), host_pitch, width - skip, height,
                    cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    CK(cudaMemcpy2DAsync(b, b_pitch, a, a_pitch, width, height, cudaMemcpyDeviceToDevice,
                         stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy2D(out.data(), out_pitch, b, b_pitch, width, height, cudaMemcpyDeviceToHost));
    for (size_t y = 0; y < height; y++)
        for (size_t x = 0; x < out_pitch; x++) {
            byte want = x >= width ? 0 : x < skip ? 0xab : host[y * host_pitch + x - skip];
            EXPECT(out[y * out_pitch + x] == want, "2D: row %zu byte %zu = %d, want %d", y, x,
                   out[y * out_pitch + x], want);
        }
    printf("CHECK two_d %llu\n", weighted(out.data(), out.size()));
    CK(cudaStreamDestroy(stream));
    CK(cudaFree(a));
    CK(cudaFree(b));
}

// ---- 3D -----------------------------------------------------------------------------------
// The device box is W x H x D; a box of (W - 20) x (H - 3) x (D - 1) bytes from (5, 2, 1) of
// the host rows lands at (10, 1, 0); the rest keeps the memset value.
static const size_t W = 300, H = 20, D = 6;
static const size_t HOST_PITCH = W + 20, HOST_ROWS = H + 3, HOST_SLICES = D + 1;

static byte expected_3d(size_t x, size_t y, size_t z) {
    bool inside = x >= 10 && x < 10 + W - 20 && y >= 1 && y < 1 + H - 3 && z < D - 1;
    return inside ? pattern(x - 10 + 5, y - 1 + 2, z + 1) : 0x11;
}

// Reads a device box into packed rows and checks every byte; returns their weighted sum.
static unsigned long long check_box(cudaPitchedPtr box, const char *what) {
    std::vector<byte> packed(W * H * D);
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = box;
    p.dstPtr = make_cudaPitchedPtr(packed.data(), W, W, H);
    p.extent = make_cudaExtent(W, H, D);
    p.kind = cudaMemcpyDeviceToHost;
    CK(cudaMemcpy3D(&p));
    for (size_t z = 0; z < D; z++)
        for (size_t y = 0; y < H; y++)
            for (size_t x = 0; x < W; x++) {
                byte got = packed[(z * H + y) * W + x], want = expected_3d(x, y, z);
                EXPECT(got == want, "3D %s: (%zu, %zu, %zu) = %d, want %d", what, x, y, z, got,
                       want);
            }
    return weighted(packed.data(), packed.size());
}

static cudaPitchedPtr three_d() {
    std::vector<byte> host(HOST_PITCH * HOST_ROWS * HOST_SLICES);
    for (size_t z = 0; z < HOST_SLICES; z++)
        for (size_t y = 0; y < HOST_ROWS; y++)
            for (size_t x = 0; x < HOST_PITCH; x++)
                host[(z * HOST_ROWS + y) * HOST_PITCH + x] = pattern(x, y, z);
    cudaExtent whole = make_cudaExtent(W, H, D);
    cudaPitchedPtr a, b;
    CK(cudaMalloc3D(&a, whole));
    CK(cudaMalloc3D(&b, whole));
    CK(cudaMemset3D(a, 0x11, whole));

    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(host.data(), HOST_PITCH, HOST_PITCH, HOST_ROWS);
    p.srcPos = make_cudaPos(5, 2, 1);
    p.dstPtr = a;
    p.dstPos = make_cudaPos(10, 1, 0);
    p.extent = make_cudaExtent(W - 20, H - 3, D - 1);
    p.kind = cudaMemcpyHostToDevice;
    CK(cudaMemcpy3D(&p));

    memset(&p, 0, sizeof p);
    p.srcPtr = a;
    p.dstPtr = b;
    p.extent = whole;
    p.kind = cudaMemcpyDeviceToDevice;
    CK(cudaMemcpy3D(&p));
    printf("CHECK three_d %llu\n", check_box(b, "device to device"));
    CK(cudaFree(b.ptr));
    return a;
}

// ---- peer ---------------------------------------------------------------------------------
static void expect_bytes(int device, const byte *ptr, const std::vector<byte> &want,
                         const char *what) {
    std::vector<byte> got(want.size());
    CK(cudaSetDevice(device));
    CK(cudaMemcpy(got.data(), ptr, got.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < want.size(); i++)
        EXPECT(got[i] == want[i], "%s: byte %zu = %d, want %d", what, i, got[i], want[i]);
}

static void peer(int last, cudaPitchedPtr box) {
    // More than one relay step of a copy between servers, and not a whole number of them.
    const size_t n = (9 << 20) + 123;
    std::vector<byte> data(n);
    for (size_t i = 0; i < n; i++) data[i] = pattern(i, i >> 10, i >> 20);
    byte *first, *first_back, *other, *other_unified;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&first, n));
    CK(cudaMalloc(&first_back, n));
    CK(cudaMemcpy(first, data.data(), n, cudaMemcpyHostToDevice));
    CK(cudaSetDevice(last));
    CK(cudaMalloc(&other, n));
    CK(cudaMalloc(&other_unified, n));
    int can_access = -1;
    CK(cudaDeviceCanAccessPeer(&can_access, 0, last));
    printf("peer_access %d\n", can_access);

    CK(cudaMemcpyPeer(other, last, first, 0, n));
    expect_bytes(last, other, data, "cudaMemcpyPeer");
    CK(cudaSetDevice(0));
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    CK(cudaMemcpyPeerAsync(first_back, 0, other, last, n, stream));
    CK(cudaStreamSynchronize(stream));
    expect_bytes(0, first_back, data, "cudaMemcpyPeerAsync back");
    CK(cudaMemcpy(other_unified, first, n, cudaMemcpyDefault));
    expect_bytes(last, other_unified, data, "cudaMemcpyDefault");

    // The 3D box of device 0 to a box of the last device, then checked there.
    CK(cudaSetDevice(last));
    cudaPitchedPtr there;
    CK(cudaMalloc3D(&there, make_cudaExtent(W, H, D)));
    cudaMemcpy3DPeerParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = box;
    p.srcDevice = 0;
    p.dstPtr = there;
    p.dstDevice = last;
    p.extent = make_cudaExtent(W, H, D);
    CK(cudaMemcpy3DPeer(&p));
    printf("CHECK peer_3d %llu\n", check_box(there, "peer"));
    printf("CHECK peer %llu\n", weighted(data.data(), n));

    CK(cudaFree(there.ptr));
    CK(cudaFree(other));
    CK(cudaFree(other_unified));
    CK(cudaSetDevice(0));
    CK(cudaStreamDestroy(stream));
    CK(cudaFree(first));
    CK(cudaFree(first_back));
}

int main() {
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    printf("devices %d\n", count);
    CK(cudaSetDevice(0));
    two_d();
    cudaPitchedPtr box = three_d();
    peer(count - 1, box);
    CK(cudaSetDevice(0));
    CK(cudaFree(box.ptr));
    printf("PASS " PROG "\n");
    return 0;
}
