"""The cost models must rank a fused GPU kernel above the eager reference on a GPU, whatever
the problem size (seen on the H200: a tiny problem ranked the reference first)."""
import dataclasses

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
    gpu = [e for e in ENGINES if e.name.startswith("sm90") and not e.check_support(p)]
    assert gpu, "the sm90 engine is registered"
    for eng in gpu:
        best = min(eng.cost(p, k) for k in eng.knob_space(p))
        assert best < ref_cost, (eng.name, best, ref_cost)
    # the same shapes with NVFP4 operands: the block-scaled Hopper engine
    from cudnn_ext.problem import ActConfig, BlockScaleConfig

    fp4 = dataclasses.replace(p, ab_dtype=torch.uint8, act=ActConfig(dgeglu_applies_beta=False),
                              block_scale=BlockScaleConfig(sf_dtype=torch.float8_e4m3fn, sf_vec_size=16))
    eng = next(e for e in ENGINES if e.name == "sm90_blockscaled")
    if not eng.check_support(fp4):
        best = min(eng.cost(fp4, k) for k in eng.knob_space(fp4))
        assert best < min(ref.cost(fp4, k) for k in ref.knob_space(fp4)), (best, ref_cost)


def test_a_built_plan_is_rechecked_at_a_new_token_count():
    """Plans are memoized without M; an engine whose support depends on M must be asked again."""
    from cudnn_ext.engines.base import Knobs
    from cudnn_ext.engines.registry import Candidate
    from cudnn_ext.errors import EngineDeclined
    from cudnn_ext.plan.execution import ExecutionPlan

    class SmallOnly(ReferenceEngine):
        name = "small_only"

        def check_support(self, problem):
            return [] if problem.m <= 512 else [f"M = {problem.m} is over this engine's 32-bit limit"]

    p = DgluProblem(n=32, k=64, num_experts=1, m=512, weight_mode="dense", b_major="k", ab_dtype=torch.bfloat16,
                    c_dtype=torch.bfloat16, d_dtype=torch.bfloat16)
    eng = SmallOnly()
    ran = []
    plan = ExecutionPlan(p, Candidate(eng, Knobs(), 0.0, "A"), eng.build(p, Knobs()))
    plan.compiled.execute = lambda pack, ws=None, st=None: ran.append(pack["c"].shape[0])
    plan.execute({"c": torch.empty(512, 64)})
    with pytest.raises(EngineDeclined, match="at M = 1024"):
        plan.execute({"c": torch.empty(1024, 64)})
    assert ran == [512]
