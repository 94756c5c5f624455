import torch

import cudnn_ext as cudnn


def test_import_does_not_pull_cutlass():
    import subprocess
    import sys

    code = "import sys, cudnn_ext; print('cutlass' in sys.modules, 'cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_aliases():
    assert cudnn.GroupedGemmDgluSm100 is cudnn.GroupedGemmDglu
    assert cudnn.grouped_gemm_dglu_wrapper_sm100 is cudnn.grouped_gemm_dglu_wrapper
