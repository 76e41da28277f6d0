"""Skip markers for GPU tests whose reason names what this machine lacks: the first missing
package ("tensorrt not installed"), else the device ("no CUDA device")."""

from __future__ import annotations

from importlib.util import find_spec

import pytest


def cuda_device_count() -> int:
    """CUDA devices visible here, asked through torch or pycuda, whichever is installed."""
    if find_spec("torch") is not None:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if find_spec("pycuda") is not None:
        try:
            import pycuda.driver as cuda

            cuda.init()
            return int(cuda.Device.count())
        except Exception:  # no driver, or no device: pycuda raises its own errors
            return 0
    return 0


def missing(*packages: str) -> str | None:
    """Why a GPU test cannot run here, or None when it can."""
    for package in packages:
        if find_spec(package) is None:
            return f"{package} not installed"
    if cuda_device_count() == 0:
        return "no CUDA device"
    return None


def needs_gpu(*packages: str) -> pytest.MarkDecorator:
    """Skip unless every one of `packages` imports and a CUDA device is visible."""
    reason = missing(*packages)
    return pytest.mark.skipif(reason is not None, reason=reason or "")
