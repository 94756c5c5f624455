"""The cost models must rank a fused GPU kernel above the eager reference on a GPU, whatever
the problem size (seen on the H200: a tiny problem ranked the reference first)."""
import pytest
import torch

from cudnn_ext.engines.reference import ReferenceEngine
from cudnn_ext.engines.registry import ENGINES
from cudnn_ext.problem import DgluProblem


def _problem(m, n, k, L):
    return DgluProblem(n=n, k=k, num_experts=L, m=m, weight_mode="dense", b_major="k", ab_dtype=torch.bfloat16,
                       c_dtype=torch.bfloat16, d_dtype=torch.bfloat16, device_type="cuda", device_index=0)


@pytest.mark.parametrize("shape", [(512, 32, 16, 1), (1024, 64, 32, 3), (32768, 2048, 7168, 8), (16384, 768, 2048, 32)])
def test_gpu_kernels_rank_above_the_reference_on_cuda(shape):
    p = _problem(*shape)
    ref = ReferenceEngine()
    ref_cost = min(ref.cost(p, k) for k in ref.knob_space(p))
    gpu = [e for e in ENGINES if e.name.startswith("sm90")]
    assert gpu, "the sm90 engine is registered"
    for eng in gpu:
        best = min(eng.cost(p, k) for k in eng.knob_space(p))
        assert best < ref_cost, (eng.name, best, ref_cost)
