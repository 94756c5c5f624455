"""SM90 engine through the public wrapper, and under CUDA-graph capture (``pytest -m gpu``).

Both compare with the float64 reference on fresh random data (tolerances of sm90_cases.TOL).
"""
import pytest
import torch

from sm90_cases import TOL, Case, capture_execute, make_pack, refill, rel_err, skip_unless_sm90

pytestmark = pytest.mark.gpu


def test_wrapper_pins_sm90_engine():
    skip_unless_sm90()
    import cudnn_ext
    from cudnn_ext.reference import reference_outputs

    problem, pack = make_pack(Case([256, 0, 512], 128, 192, "dswiglu", extra_rows=0))
    pack["dprob"].zero_()
    ref = reference_outputs(problem, pack, compute_dtype=torch.float64)
    out = cudnn_ext.grouped_gemm_dglu_wrapper(
        pack["a"], pack["c"], None, pack["padded_offsets"], pack["alpha"], pack["beta"],
        pack["prob"], pack["dprob"], b_tensor=pack["b"], generate_dbias=True,
        act_func="dswiglu", engine="sm90_cutedsl")
    torch.cuda.synchronize()
    assert rel_err(out["d_row_tensor"][..., 0], ref["d_row"]) < TOL["d_bf16"]
    assert rel_err(pack["dprob"], ref["dprob"]) < TOL["dprob"]
    assert rel_err(out["dbias_tensor"][..., 0], ref["dbias"]) < TOL["dbias"]


def test_plan_replays_in_a_cuda_graph():
    """execute() has no host sync or allocation visible to capture: capture once, then
    replay on new input values written into the same buffers."""
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for
    from cudnn_ext.reference import reference_outputs

    problem, pack = make_pack(Case([512, 256, 0, 768], 256, 320, "dgeglu", extra_rows=256))
    plan = Sm90DgluEngine().build(problem, config_for(problem, tile_n=128))
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    g = capture_execute(plan, pack, ws)
    for _ in range(2):
        refill(pack)
        ref = reference_outputs(problem, pack, compute_dtype=torch.float64)
        g.replay()
        torch.cuda.synchronize()
        rows = int(pack["padded_offsets"][-1])
        assert rel_err(pack["d_row"][:rows], ref["d_row"][:rows]) < TOL["d_bf16"]
        assert torch.isnan(pack["d_row"][rows:]).all()
        assert rel_err(pack["dprob"], ref["dprob"]) < TOL["dprob"]
        assert rel_err(pack["dbias"], ref["dbias"]) < TOL["dbias"]
