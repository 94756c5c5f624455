"""dGeGLU at its clamp bounds on the reference engine (tests/support/boundary_cases.py): the
derivative masks include the bounds and exclude one bf16 step beyond, for the vendor's
defaults and DeepSeek-V4.1's configuration; the GPU tier runs the same cases on the kernel."""
import pytest
import torch
from boundary_cases import CONFIGS, boundary_case, check, run


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_masks_at_and_beside_the_bounds(config):
    t = boundary_case(config)
    check(t, run(t), tol=1e-6)


def test_the_points_sit_on_both_sides(monkeypatch):
    """The cases hold each bound and its two bf16 neighbours, and an exclusive mask (the
    derivative's other side at the bound) fails the check."""
    t = boundary_case("dsv4.1")
    vals = set(t["c64"].unique().tolist())
    assert {9.9375, 10.0, 10.0625, -10.0625, -10.0, -9.9375} <= vals
    from cudnn_ext.reference import epilogue

    real = epilogue.local_derivatives

    def exclusive(act, gate, up):  # the masks without the bounds
        dg, du, av = real(act, gate, up)
        at = (gate == act.clamp_max)[..., :]
        return torch.where(at, 0.0, dg), torch.where((up == act.clamp_max) | (up == act.clamp_min), 0.0, du), av

    monkeypatch.setattr(epilogue, "local_derivatives", exclusive)
    import cudnn_ext.reference.grouped_dglu as gd

    monkeypatch.setattr(gd, "local_derivatives", exclusive)
    with pytest.raises(AssertionError):
        check(t, run(t), tol=1e-6)
