// textures: CUDA arrays, textures and surfaces. A 2D float array filled from host rows and read
// through a texture object; a second array written through a surface object and read back; a
// 3D array filled with cudaMemcpy3D and read through a 3D texture; a texture over linear device
// memory; copies device -> array, array -> array and array -> device; the array's descriptor;
// a mipmapped array read at each level of detail.
// Every result is checked against the CPU.
//
//   nvcc -O2 -o textures textures.cu && ./textures
//
// Prints `CHECK` lines, then `PASS textures`, or `FAIL textures: why` and exit status 1.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

#define PROG "textures"
#include "check.h"

__global__ void read2d(cudaTextureObject_t tex, float *out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f);
}

__global__ void write2d(cudaSurfaceObject_t surf, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) surf2Dwrite(float(x * 3 - y), surf, x * (int)sizeof(float), y);
}

__global__ void read3d(cudaTextureObject_t tex, float *out, int w, int h, int d) {
    int x = threadIdx.x, y = blockIdx.x, z = blockIdx.y;
    if (x < w && y < h && z < d)
        out[(z * h + y) * w + x] = tex3D<float>(tex, x + 0.5f, y + 0.5f, z + 0.5f);
}

__global__ void fetch1d(cudaTextureObject_t tex, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(tex, i) * 2.0f;
}

__global__ void read_lod(cudaTextureObject_t tex, float lod, float *out) {
    *out = tex2DLod<float>(tex, 0.5f, 0.5f, lod);
}

static cudaTextureObject_t texture_of(cudaArray_t array) {
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = array;
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex;
    CK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    return tex;
}

int main() {
    const int w = 64, h = 32;
    std::vector<float> host(w * h), back(w * h);
    for (int i = 0; i < w * h; ++i) host[i] = float(i % 251) * 0.5f;
    float *out;
    CK(cudaMalloc(&out, w * h * sizeof(float)));
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();

    // 2D array from host rows, read through a texture.
    cudaArray_t a;
    CK(cudaMallocArray(&a, &fdesc, w, h));
    CK(cudaMemcpy2DToArray(a, 0, 0, host.data(), w * sizeof(float), w * sizeof(float), h,
                           cudaMemcpyHostToDevice));
    cudaTextureObject_t tex = texture_of(a);
    read2d<<<dim3((w + 63) / 64, h), 64>>>(tex, out, w, h);
    CK_LAUNCH();
    CK(cudaMemcpy(back.data(), out, w * h * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < w * h; ++i) EXPECT(back[i] == host[i], "tex2D[%d] = %g, not %g", i, back[i], host[i]);
    printf("CHECK tex2d %.6e %.6e\n", back[1], back[w * h - 1]);
    // The descriptors read back from the object, as they were given.
    cudaResourceDesc res_back = {};
    cudaTextureDesc td_back = {};
    CK(cudaGetTextureObjectResourceDesc(&res_back, tex));
    CK(cudaGetTextureObjectTextureDesc(&td_back, tex));
    printf("CHECK tex_descs %d %d %d %d %d\n", (int)res_back.resType, res_back.res.array.array == a,
           (int)td_back.addressMode[0], (int)td_back.filterMode, (int)td_back.readMode);

    // The array's descriptor.
    cudaChannelFormatDesc got;
    cudaExtent ext;
    unsigned flags;
    CK(cudaArrayGetInfo(&got, &ext, &flags, a));
    EXPECT(ext.width == (size_t)w && ext.height == (size_t)h && got.x == 32 && got.f == cudaChannelFormatKindFloat,
           "array info %zux%zu x=%d", ext.width, ext.height, got.x);

    // A surface: written by a kernel, read back as host rows (a sub-box too).
    cudaArray_t s;
    CK(cudaMallocArray(&s, &fdesc, w, h, cudaArraySurfaceLoadStore));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = s;
    cudaSurfaceObject_t surf;
    CK(cudaCreateSurfaceObject(&surf, &res));
    write2d<<<dim3((w + 63) / 64, h), 64>>>(surf, w, h);
    CK_LAUNCH();
    CK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), s, 0, 0, w * sizeof(float), h,
                             cudaMemcpyDeviceToHost));
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            EXPECT(back[y * w + x] == float(x * 3 - y), "surface (%d,%d) = %g", x, y, back[y * w + x]);
    float box[4 * 3];
    CK(cudaMemcpy2DFromArray(box, 4 * sizeof(float), s, 5 * sizeof(float), 7, 4 * sizeof(float), 3,
                             cudaMemcpyDeviceToHost));
    EXPECT(box[0] == float(5 * 3 - 7) && box[11] == float(8 * 3 - 9), "sub-box %g %g", box[0], box[11]);
    printf("CHECK surface %.6e %.6e %.6e\n", back[w + 1], box[0], box[11]);

    // Device -> array, array -> array, array -> device.
    float *dev;
    CK(cudaMalloc(&dev, w * h * sizeof(float)));
    CK(cudaMemcpy(dev, host.data(), w * h * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy2DToArray(s, 0, 0, dev, w * sizeof(float), w * sizeof(float), h,
                           cudaMemcpyDeviceToDevice));
    cudaArray_t c;
    CK(cudaMallocArray(&c, &fdesc, w, h));
    CK(cudaMemcpy2DArrayToArray(c, 0, 0, s, 0, 0, w * sizeof(float), h, cudaMemcpyDeviceToDevice));
    CK(cudaMemset(dev, 0, w * h * sizeof(float)));
    CK(cudaMemcpy2DFromArray(dev, w * sizeof(float), c, 0, 0, w * sizeof(float), h,
                             cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(back.data(), dev, w * h * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < w * h; ++i) EXPECT(back[i] == host[i], "device round trip [%d] = %g", i, back[i]);
    printf("CHECK device_arrays %.6e\n", back[w * h / 2]);

    // A 3D array (16 x 8 x 4) through cudaMemcpy3D and a 3D texture.
    const int W = 16, H = 8, D = 4;
    std::vector<float> vol(W * H * D), vback(W * H * D);
    for (int i = 0; i < W * H * D; ++i) vol[i] = float(i) - 100.0f;
    cudaArray_t v;
    CK(cudaMalloc3DArray(&v, &fdesc, make_cudaExtent(W, H, D)));
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(vol.data(), W * sizeof(float), W, H);
    p.dstArray = v;
    p.extent = make_cudaExtent(W, H, D);
    p.kind = cudaMemcpyHostToDevice;
    CK(cudaMemcpy3D(&p));
    cudaTextureObject_t tex3 = texture_of(v);
    read3d<<<dim3(H, D), W>>>(tex3, out, W, H, D);
    CK_LAUNCH();
    CK(cudaMemcpy(vback.data(), out, W * H * D * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < W * H * D; ++i) EXPECT(vback[i] == vol[i], "tex3D[%d] = %g", i, vback[i]);
    printf("CHECK tex3d %.6e %.6e\n", vback[0], vback[W * H * D - 1]);

    // A texture over linear device memory.
    cudaResourceDesc lin = {};
    lin.resType = cudaResourceTypeLinear;
    lin.res.linear.devPtr = dev;
    lin.res.linear.desc = fdesc;
    lin.res.linear.sizeInBytes = w * h * sizeof(float);
    cudaTextureDesc td = {};
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t ltex;
    CK(cudaCreateTextureObject(&ltex, &lin, &td, nullptr));
    fetch1d<<<(w * h + 255) / 256, 256>>>(ltex, out, w * h);
    CK_LAUNCH();
    CK(cudaMemcpy(back.data(), out, w * h * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < w * h; ++i) EXPECT(back[i] == 2 * host[i], "tex1Dfetch[%d] = %g", i, back[i]);
    printf("CHECK linear_texture %.6e\n", back[100]);

    // A mipmapped array: each level filled with its own value, read through one texture at
    // each level of detail.
    cudaMipmappedArray_t mip;
    const int levels = 3;
    CK(cudaMallocMipmappedArray(&mip, &fdesc, make_cudaExtent(w, h, 0), levels));
    for (int level = 0; level < levels; ++level) {
        cudaArray_t lvl;
        CK(cudaGetMipmappedArrayLevel(&lvl, mip, level));
        cudaExtent lext;
        CK(cudaArrayGetInfo(nullptr, &lext, nullptr, lvl));
        EXPECT(lext.width == size_t(w >> level) && lext.height == size_t(h >> level),
               "level %d is %zux%zu", level, lext.width, lext.height);
        std::vector<float> fill(lext.width * lext.height, float(level + 1));
        CK(cudaMemcpy2DToArray(lvl, 0, 0, fill.data(), lext.width * sizeof(float),
                               lext.width * sizeof(float), lext.height, cudaMemcpyHostToDevice));
    }
    cudaResourceDesc mres = {};
    mres.resType = cudaResourceTypeMipmappedArray;
    mres.res.mipmap.mipmap = mip;
    cudaTextureDesc mtd = {};
    mtd.addressMode[0] = mtd.addressMode[1] = cudaAddressModeClamp;
    mtd.filterMode = cudaFilterModePoint;
    mtd.mipmapFilterMode = cudaFilterModePoint;
    mtd.readMode = cudaReadModeElementType;
    mtd.normalizedCoords = 1;
    mtd.maxMipmapLevelClamp = float(levels - 1);
    cudaTextureObject_t mtex;
    CK(cudaCreateTextureObject(&mtex, &mres, &mtd, nullptr));
    float lods[levels];
    for (int level = 0; level < levels; ++level) {
        read_lod<<<1, 1>>>(mtex, float(level), out);
        CK_LAUNCH();
        CK(cudaMemcpy(&lods[level], out, sizeof(float), cudaMemcpyDeviceToHost));
        EXPECT(lods[level] == float(level + 1), "mipmap level %d reads %g", level, lods[level]);
    }
    printf("CHECK mipmap %.6e %.6e %.6e\n", lods[0], lods[1], lods[2]);
    CK(cudaDestroyTextureObject(mtex));
    CK(cudaFreeMipmappedArray(mip));

    CK(cudaDestroyTextureObject(ltex));
    CK(cudaDestroyTextureObject(tex3));
    CK(cudaDestroyTextureObject(tex));
    CK(cudaDestroySurfaceObject(surf));
    CK(cudaFreeArray(v));
    CK(cudaFreeArray(c));
    CK(cudaFreeArray(s));
    CK(cudaFreeArray(a));
    CK(cudaFree(dev));
    CK(cudaFree(out));
    printf("PASS textures\n");
    return 0;
}
