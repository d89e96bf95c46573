// Kernels of `rgpu bench cuda`. The benchmark embeds their PTX (cuda_kernels.ptx, portable
// across GPUs: the driver compiles it for the one it runs on), so it needs no CUDA toolkit.
// Regenerate after a change, on a machine with nvcc:
//   nvcc -ptx -arch=compute_75 -o cuda_kernels.ptx cuda_kernels.cu

// The launch-rate test: a launch that does nothing.
extern "C" __global__ void empty_kernel() {}

// The compute-bound test: C = A * B for n x n row-major matrices, n a multiple of 64. Each
// block computes a 64x64 tile of C with 256 threads, 4x4 values per thread, staging 64x16
// slices of A and B in shared memory.
#define TILE 64
#define SLICE 16

extern "C" __global__ void __launch_bounds__(256)
sgemm(int n, const float *__restrict__ a, const float *__restrict__ b, float *__restrict__ c) {
    __shared__ float a_slice[SLICE][TILE]; // transposed: a_slice[k][row]
    __shared__ float b_slice[SLICE][TILE];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < n; k0 += SLICE) {
        for (int i = threadIdx.x; i < TILE * SLICE; i += blockDim.x) {
            const int ar = i / SLICE, ak = i % SLICE;
            a_slice[ak][ar] = a[(size_t)(row0 + ar) * n + k0 + ak];
            const int bk = i / TILE, bc = i % TILE;
            b_slice[bk][bc] = b[(size_t)(k0 + bk) * n + col0 + bc];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SLICE; k++) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                av[i] = a_slice[k][ty * 4 + i];
                bv[i] = b_slice[k][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            c[(size_t)(row0 + ty * 4 + i) * n + col0 + tx * 4 + j] = acc[i][j];
}
