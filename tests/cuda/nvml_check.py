"""NVML as a program sees it (pynvml, then PyTorch), for scripts/gpu-check.sh's `nvml` check:
natively it shows the machine's GPUs; through `rgpu run` with two servers serving the same GPU,
both servers' devices (2), each with that GPU's UUID. Prints `nvml count N`, one
`nvml device I NAME UUID TOTAL_MIB` line per device, and `torch count N` (or `torch missing`).
"""

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
    x = torch.ones(1024, device=f"cuda:{torch.cuda.device_count() - 1}")
    print(f"torch sum {float(x.sum())}")
