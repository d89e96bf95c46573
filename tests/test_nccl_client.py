"""The drop-in libnccl.so.2 as a program sees it: `rgpu run` preloads it, so a program that
loads NCCL by its soname gets rgpu's, which carries NCCL's calls to the servers' own NCCL
through rgpu's libcuda.so.1. Runs without a GPU (CI): the server then has no CUDA, and every
call that needs a server answers NCCL's own error (ncclSystemError), never a crash or a hang;
what needs no server (error strings, argument checks, groups) answers as NCCL does."""

import subprocess
import sys
import textwrap

import rgpu_harness as h

PROBE = textwrap.dedent(r"""
    import ctypes, os
    preloaded = os.environ.get("LD_PRELOAD", "")
    assert "libnccl.so.2" in preloaded, preloaded
    nccl = ctypes.CDLL("libnccl.so.2")
    assert hasattr(nccl, "rgpu_nccl_client"), "libnccl.so.2 is not rgpu's"
    SYSTEM_ERROR, INVALID_ARGUMENT, INVALID_USAGE = 2, 4, 5
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    assert nccl.ncclGetErrorString(INVALID_ARGUMENT).startswith(b"invalid argument")
    # No server with CUDA: NCCL's own error, at once.
    version = ctypes.c_int(-1)
    assert nccl.ncclGetVersion(ctypes.byref(version)) == SYSTEM_ERROR
    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]
    unique_id = UniqueId()
    assert nccl.ncclGetUniqueId(ctypes.byref(unique_id)) == SYSTEM_ERROR
    comm = ctypes.c_void_p()
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 2, unique_id, 0) == SYSTEM_ERROR
    # Arguments NCCL refuses: a rank outside the communicator; an unknown communicator.
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 2, unique_id, 2) == INVALID_ARGUMENT
    count = ctypes.c_int(-1)
    assert nccl.ncclCommCount(ctypes.c_void_p(0x1234), ctypes.byref(count)) == INVALID_ARGUMENT
    assert nccl.ncclAllReduce(None, None, 1, 7, 0, ctypes.c_void_p(0x1234), None) == INVALID_ARGUMENT
    # Groups nest; an end without a start is an error.
    assert nccl.ncclGroupStart() == 0 and nccl.ncclGroupStart() == 0
    assert nccl.ncclGroupEnd() == 0 and nccl.ncclGroupEnd() == 0
    assert nccl.ncclGroupEnd() == INVALID_USAGE
    # A function rgpu does not implement: ncclInvalidUsage, logged once.
    assert nccl.ncclCommRevoke(ctypes.c_void_p(0x1234), 0) == INVALID_USAGE
    assert nccl.pncclCommRevoke(ctypes.c_void_p(0x1234), 0) == INVALID_USAGE
    # Destroying nothing is fine, as in NCCL.
    assert nccl.ncclCommDestroy(None) == 0
    print("nccl probe done")
""")


def test_drop_in_libnccl_without_cuda(server):
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PROBE])
    result = subprocess.run(cmd, env=h.base_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nccl probe done" in result.stdout
    assert result.stderr.count("ncclCommRevoke is not supported") == 1, result.stderr
