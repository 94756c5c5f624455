"""The bounds of the GPU round_dgrad test (``sm90_cases.round_dgrad_cases``), checked on the
CPU with the reference engine: in fp32 it stays within ROUND_TOL of the rounded float64
reference (an exact GEMM leaves only the epilogue's error), and the rounding's own effect on
D and on dprob exceeds ROUND_EFFECT, so the GPU test can tell a missing rounding from noise."""
import dataclasses

import pytest
import torch

from cudnn_ext.reference import reference_outputs
from cudnn_ext.reference.grouped_dglu import grouped_dglu_reference
from sm90_cases import ROUND_EFFECT, ROUND_TOL, make_pack, round_dgrad_cases
import sm90_cases


def _frobenius(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("case", round_dgrad_cases(), ids=lambda c: c.label())
def test_round_dgrad_bounds_on_the_reference_engine(case):
    torch.manual_seed(0)
    problem, pack = make_pack(case, device="cpu")
    rows = int(pack["padded_offsets"][-1])
    rounded = reference_outputs(problem, pack, compute_dtype=torch.float64)
    plain = dataclasses.replace(problem, round_dgrad_to_input_dtype=False)
    unrounded = reference_outputs(plain, pack, compute_dtype=torch.float64)
    grouped_dglu_reference(problem, pack)  # fp32, into the pack's outputs
    for got, want, other in ((pack["d_row"][:rows], rounded["d_row"][:rows], unrounded["d_row"][:rows]),
                             (pack["dprob"][:rows], rounded["dprob"][:rows], unrounded["dprob"][:rows])):
        assert _frobenius(got, want) < ROUND_TOL / 10
        assert _frobenius(got, other) > 1.3 * ROUND_EFFECT


def _all_cases():
    return [c for name in dir(sm90_cases) if name.endswith("_cases") and callable(getattr(sm90_cases, name))
            for c in getattr(sm90_cases, name)()]


def test_signed_beta_lands_on_experts_with_rows():
    """A zero or negative beta on an empty expert would test nothing: every signed-beta case
    puts beta 0 on an expert with rows and a negative beta and alpha on another."""
    cases = [c for c in _all_cases() if c.signed_beta]
    assert len(cases) >= 8
    for case in cases:
        small = dataclasses.replace(case, groups=[min(g, 8) for g in case.groups], n=32, k=8, extra_rows=0,
                                    m_aligned=1)
        _, pack = make_pack(small, device="cpu")
        rows = torch.tensor(case.groups)
        assert (rows[pack["beta"] == 0] > 0).all() and (pack["beta"] == 0).sum() == 1, case.label()
        assert (rows[pack["beta"] < 0] > 0).all() and (pack["alpha"] < 0).any(), case.label()
