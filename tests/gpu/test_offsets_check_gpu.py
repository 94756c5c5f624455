"""The device-side check of padded_offsets on a GPU: a wrapper call with decreasing offsets
fails at the next synchronization with the check's message (in a child process: a
device-side assert loses the process's CUDA context), and valid offsets pass."""
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

CHILD = r"""
import sys, torch, cudnn_ext as cudnn
bad = sys.argv[1] == "bad"
L, N, K, M = 2, 64, 128, 512
dev = "cuda"
offs = torch.tensor([256, 128] if bad else [256, 512], dtype=torch.int32, device=dev)
a = torch.randn(M, K, device=dev).bfloat16()
b = torch.randn(L, N, K, device=dev).bfloat16().permute(1, 2, 0)
c = torch.randn(M, 2 * N, device=dev).bfloat16()
one = torch.ones(L, device=dev)
out = cudnn.grouped_gemm_dglu_wrapper(a_tensor=a, c_tensor=c, sfa_tensor=None, padded_offsets=offs,
                                      alpha_tensor=one, beta_tensor=one, prob_tensor=torch.rand(M, device=dev),
                                      dprob_tensor=torch.zeros(M, device=dev), b_tensor=b)
torch.cuda.synchronize()
print("synchronized")
"""


@pytest.mark.parametrize("which", ["good", "bad"])
def test_wrapper_checks_offsets_on_the_device(which):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True, timeout=300, env=env)
    if which == "good":
        assert r.returncode == 0 and "synchronized" in r.stdout, r.stdout + r.stderr
    else:
        assert r.returncode != 0 and "synchronized" not in r.stdout
        # (whether the device-side message carries the check's text depends on torch's build)
        assert "padded_offsets" in r.stderr or "device-side assert" in r.stderr, r.stderr[-2000:]
