"""The drop-in libcuda.so.1 as a program sees it: `rgpu run` puts it first on the library path,
and a program loading the CUDA driver gets rgpu's. Runs without a GPU (CI): the server then has
no CUDA devices, so cuInit reports CUDA_ERROR_NO_DEVICE, while everything that needs no device
(versions, error names, cuGetProcAddress, cudart's private tables, unsupported entry points)
still answers as the driver does."""

import subprocess
import sys
import textwrap

import rgpu_harness as h

PROBE = textwrap.dedent(r"""
    import ctypes, sys
    cuda = ctypes.CDLL("libcuda.so.1")
    assert hasattr(cuda, "rgpu_cuda_client"), "libcuda.so.1 is not rgpu's"
    version = ctypes.c_int()
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 0
    print("version", version.value)
    # Before cuInit: not initialized, as the driver says.
    count = ctypes.c_int(-1)
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 3, "CUDA_ERROR_NOT_INITIALIZED"
    status = cuda.cuInit(0)
    print("init", status)
    if status == 0:
        assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value >= 1
    else:
        assert status == 100, status  # CUDA_ERROR_NO_DEVICE: a server without CUDA
    name = ctypes.c_char_p()
    assert cuda.cuGetErrorName(100, ctypes.byref(name)) == 0
    assert name.value == b"CUDA_ERROR_NO_DEVICE", name.value
    assert cuda.cuGetErrorName(123456, ctypes.byref(name)) == 1  # INVALID_VALUE
    # cuGetProcAddress hands out the versioned entry point cudart asks for.
    pfn = ctypes.c_void_p()
    found = ctypes.c_int(-1)
    assert cuda.cuGetProcAddress_v2(b"cuMemAlloc", ctypes.byref(pfn), 12000, ctypes.c_uint64(0),
                                    ctypes.byref(found)) == 0
    direct = ctypes.cast(cuda.cuMemAlloc_v2, ctypes.c_void_p).value
    assert pfn.value == direct and found.value == 0, (pfn.value, direct, found.value)
    assert cuda.cuGetProcAddress_v2(b"cuNoSuchThing", ctypes.byref(pfn), 12000,
                                    ctypes.c_uint64(0), ctypes.byref(found)) == 500  # NOT_FOUND
    # cudart's integrity table exists, with its size in slot 0.
    uuid = bytes.fromhex("D4082055BDE6704B8D34BA123C66E1F2")
    table = ctypes.POINTER(ctypes.c_uint64)()
    assert cuda.cuGetExportTable(ctypes.byref(table), uuid) == 0
    assert table[0] == 3 * 8, table[0]
    # 3D copy descriptors: a box of 2 slices x 3 rows x 5 bytes from (x 1, row 1, slice 1) of
    # pitched host rows (8 bytes apart, 4 rows a slice) into packed rows. Host to host needs no
    # device, so the descriptor's reading is checked here.
    class Memcpy3D(ctypes.Structure):
        side = [("XInBytes", ctypes.c_size_t), ("Y", ctypes.c_size_t), ("Z", ctypes.c_size_t),
                ("LOD", ctypes.c_size_t), ("MemoryType", ctypes.c_uint), ("Host", ctypes.c_void_p),
                ("Device", ctypes.c_uint64), ("Array", ctypes.c_void_p),
                ("reserved", ctypes.c_void_p), ("Pitch", ctypes.c_size_t),
                ("Height", ctypes.c_size_t)]
        _fields_ = ([("src" + n, t) for n, t in side] + [("dst" + n, t) for n, t in side]
                    + [("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
                       ("Depth", ctypes.c_size_t)])
    src = (ctypes.c_ubyte * (3 * 4 * 8))(*range(3 * 4 * 8))
    dst = (ctypes.c_ubyte * (2 * 3 * 5))()
    copy = Memcpy3D(srcXInBytes=1, srcY=1, srcZ=1, srcMemoryType=1,
                    srcHost=ctypes.cast(src, ctypes.c_void_p), srcPitch=8, srcHeight=4,
                    dstMemoryType=1, dstHost=ctypes.cast(dst, ctypes.c_void_p), dstPitch=5,
                    dstHeight=3, WidthInBytes=5, Height=3, Depth=2)
    assert cuda.cuMemcpy3D_v2(ctypes.byref(copy)) == 0
    want = [((1 + z) * 4 + 1 + y) * 8 + 1 + x for z in range(2) for y in range(3) for x in range(5)]
    assert list(dst) == want, list(dst)
    # Rows wider than their pitch overlap: CUDA_ERROR_INVALID_VALUE; so is an array side
    # without an array.
    copy.srcPitch = 4
    assert cuda.cuMemcpy3D_v2(ctypes.byref(copy)) == 1
    copy.srcPitch, copy.srcMemoryType = 8, 3
    assert cuda.cuMemcpy3D_v2(ctypes.byref(copy)) == 1
    # An entry point rgpu does not implement: CUDA_ERROR_NOT_SUPPORTED.
    assert cuda.cuDestroyExternalMemory(ctypes.c_void_p(1)) == 801
    # An IPC handle of memory that is not the program's device memory: CUDA_ERROR_INVALID_VALUE.
    handle = (ctypes.c_ubyte * 64)()
    assert cuda.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(4096)) == 1
    # Memory that is not page-locked has no device address: CUDA_ERROR_INVALID_VALUE.
    assert cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(ctypes.c_uint64()),
                                             ctypes.c_void_p(4096), 0) == 1
    print("PASS")
""")


def test_drop_in_libcuda(server):
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PROBE])
    result = subprocess.run(cmd, env=h.base_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
    assert "version 13000" in result.stdout


PANIC_PROBE = textwrap.dedent(r"""
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    version = ctypes.c_int(-1)
    # RGPU_TEST_PANIC_IN makes this entry point panic inside: the C caller gets
    # CUDA_ERROR_UNKNOWN (999), and the program goes on.
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 999
    assert version.value == -1
    name = ctypes.c_char_p()
    assert cuda.cuGetErrorName(999, ctypes.byref(name)) == 0
    assert name.value == b"CUDA_ERROR_UNKNOWN", name.value
    print("PASS")
""")


def test_a_panic_inside_an_entry_point_is_an_error_not_an_abort(server):
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PANIC_PROBE])
    env = h.base_env(RGPU_TEST_PANIC_IN="cuDriverGetVersion")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
    assert "cuDriverGetVersion panicked (RGPU_TEST_PANIC_IN=cuDriverGetVersion)" in \
        result.stderr, result.stderr[-4000:]
