#!/usr/bin/env python3
"""cuFFT through torch.fft: 1-D complex, real-to-complex and a 2-D transform, and a round trip,
against NumPy in float64.

    python3 tests/cuda/torch_fft_check.py

Prints `CHECK` lines for compare.py, then `PASS torch_fft` or `FAIL torch_fft: why`; exits 77
(`SKIP`) without a CUDA-enabled PyTorch.
"""
import sys

from checks import CheckFailed, check, run

try:
    import numpy as np
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"SKIP torch_fft: cannot import torch: {e}")
    sys.exit(77)
if torch.version.cuda is None:
    print("SKIP torch_fft: a CPU-only PyTorch")
    sys.exit(77)


def expect(what, got, ref, tol):
    err = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))
    if err > tol:
        raise CheckFailed(f"{what}: relative error {err:.3e} > {tol}")


def main():
    dev = torch.device("cuda", 0)
    rng = np.random.default_rng(3)
    signal = (rng.standard_normal(1 << 16) + 1j * rng.standard_normal(1 << 16)).astype(np.complex64)
    spectrum = torch.fft.fft(torch.from_numpy(signal).to(dev)).cpu().numpy()
    expect("fft", spectrum, np.fft.fft(signal.astype(np.complex128)), 1e-5)
    check("fft", spectrum[0].real, spectrum[0].imag, np.abs(spectrum).sum())

    real = rng.standard_normal((64, 1000)).astype(np.float32)
    half = torch.fft.rfft(torch.from_numpy(real).to(dev), dim=1).cpu().numpy()
    expect("rfft", half, np.fft.rfft(real.astype(np.float64), axis=1), 1e-5)
    check("rfft", np.abs(half).sum(), half[3, 7].real)

    image = rng.standard_normal((256, 384)).astype(np.float32)
    t = torch.from_numpy(image).to(dev)
    f2 = torch.fft.fft2(t)
    back = torch.fft.ifft2(f2).real.cpu().numpy()
    expect("fft2", f2.cpu().numpy(), np.fft.fft2(image.astype(np.float64)), 1e-5)
    expect("ifft2(fft2)", back, image, 1e-5)
    check("fft2", float(torch.abs(f2).double().sum().item()), float(back[10, 20]))


if __name__ == "__main__":
    run("torch_fft", main)
