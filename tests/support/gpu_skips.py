"""Skips shared by the GPU tests of the CuTe DSL kernels: ``pytest.skip`` with the reason when
this process cannot run them (no CUDA GPU, no CuTe DSL, or, for sm_90a-only kernels, another
GPU generation)."""
import pytest
import torch


def needs_cuda_and_dsl():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        import cutlass  # noqa: F401
    except ImportError:
        pytest.skip("nvidia-cutlass-dsl is not installed")


def needs_hopper_and_dsl():
    needs_cuda_and_dsl()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernels are compiled for sm_90a (Hopper)")
