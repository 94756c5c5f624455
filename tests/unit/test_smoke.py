import subprocess
import sys

import cudnn_ext as cudnn


def test_import_does_not_pull_cutlass_or_cuda():
    # torch may import cuda-python itself; what matters is that cudnn_ext adds none of it
    code = ("import sys, torch; before = set(sys.modules); import cudnn_ext; "
            "new = [m for m in set(sys.modules) - before if m.split('.')[0] in ('cutlass', 'cuda', 'jax')]; "
            "print(sorted(new))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert not torch_cuda_initialized_by_import()


def torch_cuda_initialized_by_import():
    code = "import torch, cudnn_ext; print(torch.cuda.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.strip() == "True"


def test_aliases():
    assert cudnn.GroupedGemmDgluSm100 is cudnn.GroupedGemmDglu
    assert cudnn.grouped_gemm_dglu_wrapper_sm100 is cudnn.grouped_gemm_dglu_wrapper
