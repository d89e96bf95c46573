"""NVML as a program sees it (pynvml, then PyTorch), for scripts/gpu-check.sh's `nvml` check:
natively it shows the machine's GPUs; through `rgpu run` with two servers serving the same GPU,
both servers' devices (2), each with that GPU's UUID. Prints `nvml count N`, one
`nvml device I NAME UUID TOTAL_MIB` line per device, and `torch count N` (or `torch missing`);
after PyTorch has used the last device, `nvml processes mine MIB` when NVML lists this process
on it (through rgpu: its own session, under this process's pid), else `nvml processes none`.
"""

import os
import sys

try:
    import pynvml
except ImportError:
    print("SKIP nvml_check: pynvml (nvidia-ml-py) is not installed")
    sys.exit(77)

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
print(f"nvml count {count}")
for i in range(count):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    print(f"nvml device {i} {name.replace(' ', '_')} {uuid} {memory.total >> 20}")
print(f"nvml driver {pynvml.nvmlSystemGetDriverVersion()}")
pynvml.nvmlShutdown()

try:
    import torch
except ImportError:
    print("torch missing")
    sys.exit(0)
# torch.cuda.device_count() counts through NVML when it loads (before initializing CUDA).
print(f"torch count {torch.cuda.device_count()}")
if torch.cuda.device_count():
    last = torch.cuda.device_count() - 1
    x = torch.ones(1024, device=f"cuda:{last}")
    print(f"torch sum {float(x.sum())}")
    torch.cuda.synchronize()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(last)
    mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
    if mine:
        print(f"nvml processes mine {(mine[0].usedGpuMemory or 0) >> 20}")
    else:
        print("nvml processes none")
    pynvml.nvmlShutdown()
