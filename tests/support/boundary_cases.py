"""dGeGLU at its clamp bounds (tests only): which side of each bound the derivative takes.

The forward is ``p * y1 * sigmoid(a * y1) * (y2 + lo)`` with ``y1 = min(gate, cmax)`` and
``y2 = clamp(up, cmin, cmax)``; its derivative masks are ``gate <= cmax`` and
``cmin <= up <= cmax`` (docs/vendor_contract.md §1.6): at a bound the derivative is the
inside one (torch's clamp subgradient, what a model's ``torch.clamp`` forward differentiates
to), one bf16 step outside it is 0. Each case puts gate and up exactly at, one bf16 step
below and one above each bound (C is bf16 and beta 1, so the kernels see those values), with
every GEMM result 1 (alpha 1: ``acc`` is a 0/1 product), in two configurations: the vendor's
defaults and DeepSeek-V4.1's clamped SwiGLU (slope 1, clamps +-10, offset 0).
"""
from __future__ import annotations

import math

import torch

import cudnn_ext as cudnn
from oracle import oracle

BF16 = torch.bfloat16
N, K, M = 64, 16, 256
#: (name, call keywords): the vendor's defaults, DeepSeek-V4.1's clamped SwiGLU (cudnn-frontend
#: pull request #1187's configuration)
CONFIGS = {
    "defaults": dict(act_func="dgeglu"),
    "dsv4.1": dict(act_func="dgeglu", geglu_alpha=1.0, glu_clamp_max=10.0, glu_clamp_min=-10.0, linear_offset=0.0),
}


def _around(x: float):
    """x and its bf16 neighbours below and above (|x| not a power of two: one step either side)."""
    step = 2.0 ** (math.floor(math.log2(abs(x))) - 7)  # bf16 keeps 8 significant bits
    return [x - step, x, x + step]


def boundary_case(config: str, device="cpu") -> dict:
    """Operands whose rows put gate and up at, just below and just above the clamp bounds."""
    kw = CONFIGS[config]
    cmax, cmin = kw.get("glu_clamp_max", 7.0), kw.get("glu_clamp_min", -7.0)
    gates = _around(cmax) + [0.5, -3.0]
    ups = _around(cmin) + _around(cmax) + [0.0, 2.5]
    pairs = [(g, u) for g in gates for u in ups]  # every gate with every up
    gate = torch.tensor([g for g, _ in pairs], dtype=torch.float64)
    up = torch.tensor([u for _, u in pairs], dtype=torch.float64)
    reps = -(-M * N // len(pairs))
    gate, up = gate.repeat(reps)[:M * N].view(M, N // 32, 32), up.repeat(reps)[:M * N].view(M, N // 32, 32)
    c = torch.stack([gate, up], dim=2).reshape(M, 2 * N).to(BF16)
    assert torch.equal(c.double(), torch.stack([gate, up], dim=2).reshape(M, 2 * N))  # bf16 values exactly
    a = torch.zeros(M, K, dtype=BF16)
    a[:, 0] = 1
    w = torch.zeros(1, N, K, dtype=BF16)
    w[:, :, 0] = 1
    on = lambda v: v.to(device)  # noqa: E731
    return dict(kw=kw, cmax=cmax, cmin=cmin, a=on(a), b=on(w).permute(1, 2, 0), c=on(c),
                offsets=on(torch.tensor([M], dtype=torch.int32)), alpha=on(torch.ones(1)), beta=on(torch.ones(1)),
                prob=on(torch.full((M,), 0.5)), c64=c.double(), w64=w[0].double(), a64=a.double())


def run(t: dict, engine=None) -> dict:
    dprob = torch.zeros(M, device=t["c"].device)
    act = torch.full((M, N), float("nan"), dtype=BF16, device=t["c"].device)
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=None, padded_offsets=t["offsets"], alpha_tensor=t["alpha"],
        beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=dprob, b_tensor=t["b"], d_dtype=BF16,
        activation_tensor=act, engine=engine, **t["kw"])
    return {"d": out["d_row_tensor"][..., 0].cpu().double(), "dprob": dprob.cpu().double(),
            "activation": act.cpu().double()}


def check(t: dict, got: dict, tol: float, d_tol: float = 2.0 ** -8) -> None:
    """Against the float64 oracle (D and the activation output within ``d_tol`` of each element,
    one bf16 rounding for the reference's; dprob within ``tol``), and each mask's side shown
    exactly: a zero derivative one step outside a bound, a nonzero one at it."""
    kw = dict(t["kw"])
    kw.pop("act_func")
    ref = oracle(t["a64"], [t["w64"]], t["c64"], [M], torch.ones(1), torch.ones(1), torch.full((M,), 0.5),
                 act_func="dgeglu", **kw)
    for key, bound in (("d", d_tol), ("dprob", tol)):
        err = ((got[key] - ref[key]).abs() / ref[key].abs().clamp_min(1e-6)).max().item()
        assert err <= bound, (key, err)
    assert ((got["activation"] - ref["activation"]).abs() <= d_tol * ref["activation"].abs()).all()
    blocks = t["c64"].view(M, N // 32, 2, 32)
    gate, up = blocks[:, :, 0].reshape(M, N), blocks[:, :, 1].reshape(M, N)
    d = got["d"].view(M, N // 32, 2, 32)
    dgate, dup = d[:, :, 0].reshape(M, N), d[:, :, 1].reshape(M, N)
    assert (dgate[gate > t["cmax"]] == 0).all() and (dgate[(gate == t["cmax"]) & (up != -kw.get("linear_offset", 1.0))] != 0).all()
    assert (dup[(up > t["cmax"]) | (up < t["cmin"])] == 0).all()
    assert (dup[((up == t["cmax"]) | (up == t["cmin"])) & (gate != 0)] != 0).all()
