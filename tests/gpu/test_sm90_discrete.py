"""SM90 kernel with discrete weights (``b_ptrs``), K- and N-major, on the GPU (``pytest -m gpu``).

Discrete B is compiled in CI (tests/compile/test_sm90_compile.py); these tests are what made the
engine offer it (first passed on the H200 on 2026-11-30, benchmarks/device_verify.sh).

What they check against the float64 reference: every expert's weight lives at its own
address (reverse order, 16-B but not 128-B aligned, NaN gaps between experts so an
out-of-bounds read shows), the workspace starts full of stale bytes, D is NaN-poisoned, an
empty expert, rows past the last offset stay untouched, N and K tails, both tiles, both
activations; a CUDA graph that captures the descriptor-building helper kernel and the main
kernel replays correctly after the pointer table is permuted on the device (descriptors are
rebuilt on every replay and the kernel does not use stale cached descriptors); and the
public wrapper with ``b_ptrs``.
"""
import pytest
import torch

from sm90_cases import (TOL, Case, capture_execute, discrete_cases, make_pack, refill, rel_err,
                        run_and_check, skip_unless_sm90)

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("case", discrete_cases(), ids=lambda c: c.label())
def test_sm90_discrete_matches_reference(case):
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine

    problem, _ = make_pack(case)
    assert Sm90DgluEngine().check_support(problem) == []
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("b_major,cluster_m", [("k", 1), ("n", 1), ("n", 2)])
def test_sm90_discrete_replays_in_a_cuda_graph(b_major, cluster_m):
    """Capture helper + main kernel once; replay on new inputs and on a permuted pointer
    table (written on the device between replays: the descriptors must follow it)."""
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for
    from cudnn_ext.reference import reference_outputs

    problem, pack = make_pack(Case([512, 256, 0, 768], 256, 320, "dgeglu", extra_rows=256,
                                   weight_mode="discrete", b_major=b_major))
    plan = Sm90DgluEngine().build(problem, config_for(problem, tile_n=128, cluster_m=cluster_m))
    ws = torch.full((plan.workspace_size,), 0xA5, dtype=torch.uint8, device="cuda")
    g = capture_execute(plan, pack, ws)
    perms = [None, torch.tensor([2, 0, 3, 1]), torch.tensor([3, 2, 1, 0])]
    original = pack["b_ptrs"].clone()
    for perm in perms:
        if perm is not None:
            pack["b_ptrs"].copy_(original[perm.to(original.device)])
        refill(pack)
        ref = reference_outputs(problem, pack, compute_dtype=torch.float64)  # reads b_ptrs
        g.replay()
        torch.cuda.synchronize()
        rows = int(pack["padded_offsets"][-1])
        assert rel_err(pack["d_row"][:rows], ref["d_row"][:rows]) < TOL["d_bf16"], perm
        assert torch.isnan(pack["d_row"][rows:]).all()
        assert rel_err(pack["dprob"], ref["dprob"]) < TOL["dprob"], perm
        assert rel_err(pack["dbias"], ref["dbias"]) < TOL["dbias"], perm


def test_wrapper_discrete_n_major_on_sm90():
    skip_unless_sm90()
    import cudnn_ext
    from cudnn_ext.reference import reference_outputs

    problem, pack = make_pack(Case([256, 0, 512], 128, 192, "dswiglu", extra_rows=0,
                                   weight_mode="discrete", b_major="n"))
    pack["dprob"].zero_()
    ref = reference_outputs(problem, pack, compute_dtype=torch.float64)
    out = cudnn_ext.grouped_gemm_dglu_wrapper(
        pack["a"], pack["c"], None, pack["padded_offsets"], pack["alpha"], pack["beta"],
        pack["prob"], pack["dprob"], b_ptrs=pack["b_ptrs"], n=128, b_dtype=torch.bfloat16,
        b_major="n", generate_dbias=True, act_func="dswiglu", engine="sm90_cutedsl")
    torch.cuda.synchronize()
    assert rel_err(out["d_row_tensor"][..., 0], ref["d_row"]) < TOL["d_bf16"]
    assert rel_err(pack["dprob"], ref["dprob"]) < TOL["dprob"]
    assert rel_err(out["dbias_tensor"][..., 0], ref["dbias"]) < TOL["dbias"]
