"""The drop-in libnvidia-ml.so.1 (librgpu_nvml.so) as programs see it.

Through `rgpu run` against a real server (CI has no GPU: the server has no CUDA devices, so
NVML initializes and counts 0, which is what a machine with the driver and no GPU says), and,
without a server, from a recorded inventory of two servers (`RGPU_TEST_NVML_RECORDED`), driven
by NVIDIA's own Python bindings (pynvml, from nvidia-ml-py) and, where one is installed, by
nvidia-smi."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import rgpu_harness as h

NVML = h.BUILD_DIR / "librgpu_nvml.so"

PROBE = textwrap.dedent(r"""
    import ctypes
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert hasattr(nvml, "rgpu_nvml_client"), "libnvidia-ml.so.1 is not rgpu's"
    count = ctypes.c_uint(99)
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1  # UNINITIALIZED
    assert nvml.nvmlShutdown() == 1
    # PyTorch's _raw_device_count_nvml: the unversioned nvmlInit, then the v2 count.
    assert nvml.nvmlInit() == 0
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    print("count", count.value)
    handle = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(count.value, ctypes.byref(handle)) == 2
    assert nvml.nvmlInitWithFlags(0) == 0
    assert nvml.nvmlShutdown() == 0 and nvml.nvmlShutdown() == 0
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1
    nvml.nvmlErrorString.restype = ctypes.c_char_p
    assert nvml.nvmlErrorString(3) == b"Not Supported"
    assert nvml.nvmlDeviceClearCpuAffinity(None) == 3  # not implemented: NOT_SUPPORTED
    # Forwarded to the servers' NVML once initialized; like NVIDIA's, UNINITIALIZED before.
    assert nvml.nvmlDeviceGetP2PStatus(None, None, 0, None) == 1
    print("PASS")
""")


def test_nvml_through_rgpu_run(server):
    if not NVML.is_file():
        pytest.skip(f"{NVML} not built")
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PROBE])
    result = subprocess.run(cmd, env=h.base_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
    # A server without CUDA devices: NVML initializes and shows none.
    assert "count 0" in result.stdout


def test_nvml_without_a_server_is_not_loaded():
    """No server answers: nvmlInit says the driver is not loaded (nvidia-smi's wording)."""
    if h.missing_binaries() or not NVML.is_file():
        pytest.skip("rgpu not built")
    probe = ("import ctypes; n = ctypes.CDLL('libnvidia-ml.so.1'); "
             "print('init', n.nvmlInit_v2())")
    cmd = h.rgpu_run_cmd([f"127.0.0.1:{h.free_port()}"], [sys.executable, "-c", probe])
    result = subprocess.run(cmd, env=h.base_env(RGPU_CONNECT_TIMEOUT="2"),
                            capture_output=True, text=True, timeout=120)
    assert "init 9" in result.stdout, result.stdout + result.stderr[-2000:]


def recorded_inventory(path):
    """Two servers: an H100 whose session uses 1 GiB, and an L4 (its server has no NVML)."""
    def device(name, byte, bus):
        return {"name": name, "uuid": [byte] * 16, "total_mem": 80 << 30,
                "attributes": [[75, 9], [76, 0]], "pci_bus_id": bus, "peers": []}

    def facts(**values):
        keys = ["serial", "board_id", "brand", "architecture", "minor_number", "pci_ids",
                "vbios_version", "num_cores", "memory_bus_width", "max_pcie_link_generation",
                "max_pcie_link_width", "default_power_limit"]
        return {**{k: None for k in keys}, "max_clocks": [], **values}

    def status(**values):
        keys = ["memory", "utilization", "temperature", "power_usage", "power_limit",
                "enforced_power_limit", "fan_speed", "performance_state", "persistence_mode",
                "compute_mode", "mig_mode", "ecc_mode", "display_mode", "display_active",
                "pcie_link_generation", "pcie_link_width", "processes"]
        return {**{k: None for k in keys}, "clocks": [], **values}

    recorded = {"servers": [
        {"inventory": {"driver_version": 13000,
                       "devices": [device("NVIDIA H100 80GB HBM3", 0xa0, "0000:1b:00.0")]},
         "nvml": {"driver_version": "580.82.07", "nvml_version": "13.580.82.07",
                  "cuda_driver_version": 13000,
                  "devices": [facts(minor_number=0, pci_ids=[0x233010de, 0x16c110de])]},
         "status": [status(memory={"total": 80 << 30, "reserved": 1 << 20,
                                   "free": 70 << 30, "used": 10 << 30},
                           utilization={"gpu": 37, "memory": 12}, temperature=41,
                           power_usage=123456, power_limit=700000, performance_state=0,
                           persistence_mode=1, compute_mode=0, mig_mode=[0, 0],
                           processes=[{"pid": 4242, "used_memory": 1 << 30}])]},
        {"inventory": {"driver_version": 12080,
                       "devices": [device("NVIDIA L4", 0xb0, "0000:41:00.0")]},
         "nvml": {"driver_version": None, "nvml_version": None, "cuda_driver_version": None,
                  "devices": [facts()]},
         "status": [status()]},
    ]}
    path.write_text(json.dumps(recorded))


@pytest.fixture
def recorded_env(tmp_path):
    if not NVML.is_file():
        pytest.skip(f"{NVML} not built")
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        (lib / name).symlink_to(NVML)
    recorded_inventory(tmp_path / "recorded.json")
    return h.base_env(LD_LIBRARY_PATH=str(lib),
                      RGPU_TEST_NVML_RECORDED=str(tmp_path / "recorded.json"))


PYNVML_PROBE = textwrap.dedent(r"""
    import os
    import pynvml as n
    n.nvmlInit()
    assert n.nvmlDeviceGetCount() == 2
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert n.nvmlDeviceGetName(h1) == "NVIDIA L4"
    uuid = n.nvmlDeviceGetUUID(h1)
    assert uuid == "GPU-b0b0b0b0-b0b0-b0b0-b0b0-b0b0b0b0b0b0", uuid
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)) == 1
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("00000000:41:00.0")) == 1
    pci = n.nvmlDeviceGetPciInfo(h0)
    assert (pci.bus, pci.pciDeviceId) == (0x1b, 0x233010de), pci
    memory = n.nvmlDeviceGetMemoryInfo(h0)
    assert (memory.total, memory.free) == (80 << 30, 70 << 30)
    memory = n.nvmlDeviceGetMemoryInfo(h0, version=n.nvmlMemory_v2)
    assert memory.reserved == 1 << 20
    util = n.nvmlDeviceGetUtilizationRates(h0)
    assert (util.gpu, util.memory) == (37, 12)
    assert n.nvmlDeviceGetTemperature(h0, n.NVML_TEMPERATURE_GPU) == 41
    assert n.nvmlDeviceGetCudaComputeCapability(h1) == (9, 0)
    assert n.nvmlDeviceGetMigMode(h0) == [0, 0]
    procs = n.nvmlDeviceGetComputeRunningProcesses(h0)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(os.getpid(), 1 << 30)], procs
    assert n.nvmlSystemGetDriverVersion() == "580.82.07"
    assert n.nvmlSystemGetCudaDriverVersion() == 13000
    try:
        n.nvmlDeviceGetPowerUsage(h1)
        raise AssertionError("the L4's server has no NVML")
    except n.NVMLError_NotSupported:
        pass
    n.nvmlShutdown()
    print("PASS")
""")


def test_pynvml_from_recorded_inventory(recorded_env):
    pytest.importorskip("pynvml")
    result = subprocess.run([sys.executable, "-c", PYNVML_PROBE], env=recorded_env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "PASS" in result.stdout, result.stdout + result.stderr


def test_nvidia_smi_from_recorded_inventory(recorded_env):
    smi = shutil.which("nvidia-smi") or os.environ.get("RGPU_TEST_NVIDIA_SMI")
    if not smi:
        pytest.skip("no nvidia-smi (RGPU_TEST_NVIDIA_SMI names one off PATH)")
    listed = subprocess.run([smi, "-L"], env=recorded_env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert listed.stdout.splitlines() == [
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a0a0a0a0-a0a0-a0a0-a0a0-a0a0a0a0a0a0)",
        "GPU 1: NVIDIA L4 (UUID: GPU-b0b0b0b0-b0b0-b0b0-b0b0-b0b0b0b0b0b0)",
    ]
    table = subprocess.run([smi], env=recorded_env, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "NVIDIA H100" in table.stdout and "580.82.07" in table.stdout
