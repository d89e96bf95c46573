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
    # An entry point rgpu does not implement: CUDA_ERROR_NOT_SUPPORTED.
    assert cuda.cuGraphCreate(ctypes.byref(ctypes.c_void_p()), 0) == 801
    print("PASS")
""")


def test_drop_in_libcuda(server):
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PROBE])
    result = subprocess.run(cmd, env=h.base_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
    assert "version 13000" in result.stdout
