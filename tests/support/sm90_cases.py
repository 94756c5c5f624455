"""Problem builders shared by the SM90 GPU tests and the device check script.

Builds a canonical variant pack on the GPU with fresh random data (hard inputs: values that
reach the dGeGLU clamps, alpha/beta != 1, prob in [0, 1], skewed and empty groups, rows past
the last offset), runs the SM90 engine and compares with the float64 reference.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from cudnn_ext.activations import activation
from cudnn_ext.problem import ActConfig, DgluProblem
from cudnn_ext.reference import reference_outputs


@dataclass(frozen=True)
class Case:
    groups: Sequence[int]  # rows per expert (multiples of m_aligned, zeros allowed)
    n: int
    k: int
    act: str = "dswiglu"
    c_dtype: torch.dtype = torch.bfloat16
    d_dtype: torch.dtype = torch.bfloat16
    dbias: bool = True
    tile_n: int = 128
    extra_rows: int = 256  # rows past offs[-1] that must stay untouched
    weight_mode: str = "dense"  # "discrete": b_ptrs, one separate allocation per expert
    b_major: str = "k"  # "n": dense (N, K, L) with strides (1, N, N*K); discrete (K, N) row-major
    cluster_m: int = 1  # 2: CTA pairs along M sharing multicast B k-tiles (dense only)
    cluster_n: int = 1  # 2 (with cluster_m 2): 2x2 clusters, A k-tiles multicast too
    raster_group_m: int = 0  # 0: the engine's default for the cluster size
    cooperative: bool = False  # both math warpgroups share each tile (tile_n up to 256)
    # beta 0 for the first expert with rows and negative for the last (the dSwiGLU epilogue
    # pulls beta out of its per-element products: that must hold for every sign), alpha negative
    signed_beta: bool = False
    c_stages: int = 0  # C blocks in flight per math warpgroup (0: the engine's default)
    c_split: int = 1  # ping-pong C ring entries of 128 / c_split rows
    split_last: int = 1  # (cooperative) the last round spread over up to rem x this many clusters
    activation: bool = False  # (dgeglu) the activation output, (M, N) bf16
    act_staged: bool = False  # the activation output through shared memory and TMA (act_staged)
    round_dgrad: bool = False  # round_dgrad_to_input_dtype: alpha^2 * acc rounded to bf16
    # every offset a multiple of this (below 256: the ragged schedule); with it, A and C rows
    # past the last offset hold NaN (a tile of the last expert reads them)
    m_aligned: int = 256
    # A and B small integers, alpha a power of two and dprob starting at zero: g0 = alpha^2 *
    # acc is exact in fp32, so rounding it (round_dgrad) gives the same bf16 on the kernel and
    # in float64, and only the epilogue's own error is left
    exact_gemm: bool = False
    deterministic: bool = False  # the fixed-order dprob/dbias form (Sm90Config.deterministic)

    def knobs(self) -> dict:
        """The config fields the case pins (``config_for``'s keywords)."""
        return dict(tile_n=self.tile_n, cluster_m=self.cluster_m, cluster_n=self.cluster_n,
                    cooperative=self.cooperative, c_stages=self.c_stages, c_split=self.c_split,
                    split_last=self.split_last,
                    **({"raster_group_m": self.raster_group_m} if self.raster_group_m else {}),
                    **({"act_staged": True} if self.act_staged else {}))

    def label(self) -> str:
        dt = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
        wm = (f"-discrete{self.b_major.upper()}" if self.weight_mode == "discrete"
              else "-denseN" if self.b_major == "n" else "")
        return (f"L{len(self.groups)}-M{sum(self.groups)}-N{self.n}-K{self.k}-{self.act}-"
                f"C{dt[self.c_dtype]}-D{dt[self.d_dtype]}-dbias{int(self.dbias)}-t{self.tile_n}"
                f"{wm}{'-cl%d' % self.cluster_m if self.cluster_m > 1 else ''}"
                f"{'x%d' % self.cluster_n if self.cluster_n > 1 else ''}"
                f"{'-r%d' % self.raster_group_m if self.raster_group_m else ''}"
                f"{'-coop' if self.cooperative else ''}{'-sbeta' if self.signed_beta else ''}"
                f"{'-c%d' % self.c_stages if self.c_stages else ''}"
                f"{'-h%d' % self.c_split if self.c_split > 1 else ''}"
                f"{'-x%d' % self.split_last if self.split_last > 1 else ''}"
                f"{'-act' if self.activation else ''}{'-staged' if self.act_staged else ''}"
                f"{'-rnd' if self.round_dgrad else ''}"
                f"{'-a%d' % self.m_aligned if self.m_aligned != 256 else ''}"
                f"{'-exact' if self.exact_gemm else ''}{'-det' if self.deterministic else ''}")


def make_pack(case: Case, device="cuda"):
    L, n, k = len(case.groups), case.n, case.k
    offs = torch.tensor(list(_cumsum(case.groups)), dtype=torch.int32, device=device)
    m = sum(case.groups) + case.extra_rows
    if case.exact_gemm:
        a = torch.randint(-8, 9, (m, k), device=device).to(torch.bfloat16)
        b = torch.randint(-8, 9, (L, n, k), device=device).to(torch.bfloat16).permute(1, 2, 0)
    else:
        a = torch.randn(m, k, device=device).to(torch.bfloat16)
        b = (torch.randn(L, n, k, device=device) / math.sqrt(k)).to(torch.bfloat16).permute(1, 2, 0)
    b_ptrs, keep = None, None
    if case.weight_mode == "dense" and case.b_major == "n":
        # N-major dense: the same values stored (L, K, N) contiguous, viewed as (N, K, L)
        b = b.permute(2, 1, 0).contiguous().permute(2, 1, 0)
        assert b.stride() == (1, n, n * k)
    if case.weight_mode == "discrete":
        b_ptrs, keep = discrete_weights(b, case.b_major)
        b = None
    c = (3.0 * torch.randn(m, 2 * n, device=device)).to(case.c_dtype)
    if case.m_aligned != 256:
        # the ragged schedule loads these rows into the last expert's partial tile: none of
        # them may reach an output
        a[sum(case.groups):] = float("nan")
        c[sum(case.groups):] = float("nan")
    pack = {
        "a": a, "b": b, "c": c,
        "d_row": torch.full((m, 2 * n), float("nan"), dtype=case.d_dtype, device=device),
        "padded_offsets": offs,
        "alpha": (0.5 + torch.rand(L, device=device)).float(),
        "beta": (0.5 + torch.rand(L, device=device)).float(),
        "prob": torch.rand(m, device=device).float(),
        "dprob": torch.randn(m, device=device).float(),  # accumulated into, not overwritten
        "dbias": (torch.randn(L, 2 * n, device=device).to(torch.bfloat16) if case.dbias else None),
    }
    if case.exact_gemm:
        pack["alpha"] = 2.0 ** torch.randint(-4, -1, (L,), device=device).float()
        pack["dprob"].zero_()
    if case.activation:
        pack["activation"] = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    if case.signed_beta:  # on the first and last experts that have rows
        live = [e for e, rows in enumerate(case.groups) if rows]
        pack["beta"][live[0]] = 0.0
        pack["beta"][live[-1]] = -1.3
        pack["alpha"][live[-1]] = -0.8
    if b_ptrs is not None:
        pack["b_ptrs"] = b_ptrs
        pack["_b_keep"] = keep  # owns the experts' memory (not a slot; engines ignore it)
    act = ActConfig(act_func=case.act, linear_offset=activation(case.act).default_linear_offset,
                    geglu_alpha=1.702, clamp_max=7.0, clamp_min=-7.0)
    problem = DgluProblem(n=n, k=k, num_experts=L, m=m, weight_mode=case.weight_mode,
                          b_major=case.b_major,
                          ab_dtype=torch.bfloat16, c_dtype=case.c_dtype, d_dtype=case.d_dtype,
                          act=act, generate_dbias=case.dbias, device_type="cuda",
                          device_index=torch.device(device).index,
                          generate_activation=case.activation,
                          round_dgrad_to_input_dtype=case.round_dgrad,
                          m_aligned=case.m_aligned, deterministic=case.deterministic)
    return problem, pack


def discrete_weights(b, b_major: str):
    """Per-expert copies of the dense (N, K, L) ``b`` at scattered addresses of one pool
    (reverse expert order, 16-B aligned but mostly not 128-B aligned, a gap between
    experts), stored K-major (N, K) or N-major (K, N) row-major. Returns (b_ptrs, pool)."""
    n, k, L = b.shape
    elems = n * k
    stride = elems + 8 * 3  # 48-byte gap: consecutive experts are not 128-B aligned
    pool = torch.full((L * stride + 64,), float("nan"), dtype=b.dtype, device=b.device)
    ptrs = []
    for e in range(L):
        slot = L - 1 - e
        off = 8 + slot * stride  # 16-byte offset from the (256-B aligned) pool
        w = b[:, :, e] if b_major == "k" else b[:, :, e].t()
        pool[off:off + elems].copy_(w.contiguous().view(-1))
        ptrs.append(pool.data_ptr() + off * b.element_size())
    assert all(p % 16 == 0 for p in ptrs)
    return torch.tensor(ptrs, dtype=torch.int64, device=b.device), pool


def refill(pack) -> None:
    """New random inputs and reset outputs, in place (the buffers a captured graph replays on):
    A, C, prob drawn again; dprob, dbias zeroed; D poisoned with NaN."""
    pack["a"].copy_(torch.randn_like(pack["a"].float()))
    pack["c"].copy_(3.0 * torch.randn_like(pack["c"].float()))
    pack["prob"].copy_(torch.rand_like(pack["prob"]))
    pack["dprob"].zero_()
    pack["dbias"].zero_()
    pack["d_row"].fill_(float("nan"))


def skip_unless_sm90():
    """pytest.skip with the SM90 engine's reason when it cannot run in this process."""
    import pytest

    from cudnn_ext.engines.sm90 import Sm90DgluEngine

    why = Sm90DgluEngine().available()
    if why:
        pytest.skip(why)


def capture_execute(plan, pack, workspace):
    """A CUDA graph of one ``plan.execute`` on a side stream (after one warm-up run outside
    the capture, so module loading is not captured). Returns the graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.execute(pack, workspace, s)  # warm-up: module load outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        plan.execute(pack, workspace, s)
    return g


def _cumsum(xs):
    s = 0
    for x in xs:
        s += x
        yield s


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max(relative Frobenius error, max|x - ref| / max|ref| / 4).

    The Frobenius term bounds the average error; the max term (4x looser, per element) keeps
    a local failure -- one zeroed or unwritten row among thousands -- from being diluted away.
    """
    x, ref = x.double(), ref.double()
    den = ref.norm().item()
    fro = (x - ref).norm().item() / (den if den > 0 else 1.0)
    peak = ref.abs().max().item() if ref.numel() else 0.0
    worst = (x - ref).abs().max().item() / (peak if peak > 0 else 1.0) if ref.numel() else 0.0
    return max(fro, worst / 4)


#: Named tolerance policy per output (see rel_err: Frobenius, and 4x this per element vs max|ref|),
#: about 2.5x the largest error the GPU suite measures (H100, ``pytest -m gpu -n 8 -rA tests``,
#: the errors ``run_and_check`` prints): bf16 D 1.7e-3 (its rounding), fp16 and fp32 D 2.3e-4
#: and dprob 1.2e-4 (round_dgrad cases whose fp32 and float64 g0 straddle a bf16 rounding
#: boundary; elsewhere ~2e-7), dbias 1.8e-3 and the activation output 1.7e-3 (bf16).
#: Small-effect options move their outputs by more (a 16-bit rounding of alpha or g0: ~1.8e-3
#: of dprob).
TOL = {"d_bf16": 4e-3, "d_fp16": 6e-4, "d_fp32": 6e-4, "dprob": 3e-4, "dbias": 4.5e-3,
       "activation": 4.5e-3}


def run_and_check(case: Case, engine=None, knobs=None, fresh: bool = False,
                  inspect=None, inspect_outputs=None) -> dict:
    """Run one case on the SM90 engine; returns the errors; raises AssertionError on failure.

    ``fresh``: run the fresh-outputs variant (``execute_fresh``) on garbage-filled dprob/dbias
    and NaN D: D rows past the last offset must become 0 and dprob/dbias this call's sums.
    ``inspect(plan, workspace)``: called after the run (the workspace was 0xA5 before it).
    ``inspect_outputs(problem, pack, ref)``: called last, with the float64 reference.
    ``knobs``: the plan's ``Sm90Config``, or a dict of config fields (``config_for``), or None
    (the case's)."""
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for

    engine = engine or Sm90DgluEngine()
    problem, pack = make_pack(case)
    if fresh:  # what the kernel must overwrite: huge values, NaN
        pack["dprob"].fill_(float("nan"))
        if case.dbias:
            pack["dbias"].fill_(3.0e38)
    dprob0 = torch.zeros_like(pack["dprob"]) if fresh else pack["dprob"].clone()
    dbias0 = (torch.zeros_like(pack["dbias"]) if fresh else pack["dbias"].clone()) if case.dbias else None
    ref = reference_outputs(problem, pack, compute_dtype=torch.float64, dprob_init=dprob0)
    if knobs is None:
        knobs = case.knobs()
    if isinstance(knobs, dict):
        knobs = config_for(problem, **knobs)
    plan = engine.build(problem, knobs)
    # stale bytes everywhere: the descriptor slots must be fully rewritten, and the launch's
    # zeroing kernel must clear the dbias sums and counters before the kernel adds to them
    ws = torch.full((max(plan.workspace_size, 1),), 0xA5, dtype=torch.uint8, device="cuda")
    (plan.execute_fresh if fresh else plan.execute)(pack, ws, torch.cuda.current_stream())
    torch.cuda.synchronize()
    if plan.zeroed_region is not None:
        # every launch leaves the dbias sums and counters zero: what lets the torch replay
        # skip the zeroing kernel (address_launcher's zeroed_workspace). Only those bytes: the
        # layout's tail padding (discrete, trace) is never written and keeps its stale bytes
        region = ws[plan.zeroed_region:plan.zeroed_region + plan.zeroed_region_bytes]
        assert region.numel() == plan.zeroed_region_bytes > 0
        assert not region.any(), f"{case.label()}: dbias workspace left dirty"
    if inspect is not None:
        inspect(plan, ws)
    rows = int(pack["padded_offsets"][-1].item()) if len(case.groups) else 0
    d = pack["d_row"]
    out = {}
    assert not torch.isnan(d[:rows]).any(), f"{case.label()}: unwritten (NaN) elements in D"
    if fresh:
        assert (d[rows:] == 0).all(), f"{case.label()}: rows past offs[-1] not zeroed"
    else:
        assert torch.isnan(d[rows:]).all(), f"{case.label()}: rows past offs[-1] were written"
    dkey = {torch.bfloat16: "d_bf16", torch.float16: "d_fp16", torch.float32: "d_fp32"}[case.d_dtype]
    out["d"] = rel_err(d[:rows], ref["d_row"][:rows])
    assert out["d"] < TOL[dkey], f"{case.label()}: D rel err {out['d']:.3e}"
    out["dprob"] = rel_err(pack["dprob"], ref["dprob"])
    assert out["dprob"] < TOL["dprob"], f"{case.label()}: dprob rel err {out['dprob']:.3e}"
    if case.dbias:
        want = (dbias0.double() + ref["dbias"])
        out["dbias"] = rel_err(pack["dbias"], want)
        assert out["dbias"] < TOL["dbias"], f"{case.label()}: dbias rel err {out['dbias']:.3e}"
    if case.activation:
        act = pack["activation"]
        assert not torch.isnan(act[:rows]).any(), f"{case.label()}: unwritten activation elements"
        if fresh:
            assert (act[rows:] == 0).all(), f"{case.label()}: activation rows past offs[-1] not zeroed"
        else:
            assert torch.isnan(act[rows:]).all(), f"{case.label()}: activation rows past offs[-1] written"
        out["activation"] = rel_err(act[:rows], ref["activation"][:rows])
        assert out["activation"] < TOL["activation"], \
            f"{case.label()}: activation rel err {out['activation']:.3e}"
    if inspect_outputs is not None:
        inspect_outputs(problem, pack, ref)
    return out


#: round_dgrad_to_input_dtype on an exact GEMM (``Case.exact_gemm``): fp32 D and dprob against
#: the rounded float64 reference leave only the epilogue's error; the rounding itself moves
#: both by about 1.7e-3 (relative Frobenius; tests/unit/test_sm90_cases.py checks both bounds
#: on the reference engine)
ROUND_TOL, ROUND_EFFECT = 1e-4, 1e-3


def round_dgrad_cases() -> list:
    """round_dgrad with fp32 C and D on an exact GEMM: both activations, dense K-major and
    discrete N-major weights."""
    return [Case([512, 0, 768], 160, 256, act, torch.float32, torch.float32, round_dgrad=True,
                 weight_mode=mode, b_major=bm, exact_gemm=True)
            for act in ("dswiglu", "dgeglu") for mode, bm in (("dense", "k"), ("discrete", "n"))]


def standard_cases() -> list:
    """The issue's correctness matrix, sized to run in seconds."""
    g = torch.Generator().manual_seed(0)

    def pareto_groups(L, mean):
        sizes = []
        for i in range(L):
            if i % 8 == 3:
                sizes.append(0)
                continue
            x = float(torch.empty(1).exponential_(generator=g)) * mean
            sizes.append(max(256, int(round(x / 256)) * 256))
        return sizes

    cases = [
        Case([512], 256, 512),  # single expert
        Case([256, 0, 768, 256], 96, 200, "dswiglu"),  # N < tile, K % 64 != 0, empty group
        Case([256, 0, 768, 256], 96, 200, "dgeglu"),
        Case([256, 512, 256], 128, 192, "dswiglu", signed_beta=True),
        Case([256, 512, 256], 128, 192, "dgeglu", torch.float16, torch.float32, signed_beta=True),
        Case([0, 512, 256], 320, 264, "dgeglu", tile_n=128),  # N % tile != 0
        Case([512, 256], 160, 128, "dswiglu", torch.float16, torch.float32),
        Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False),
        Case([256, 512], 128, 96, "dswiglu", torch.float32, torch.bfloat16, tile_n=64),
        # C and D of one dtype other than bf16: D through shared memory in fp16 (32-bit pair
        # accesses) and fp32 (scalar accesses, two 128B-swizzle atoms per block)
        Case([0, 512, 256], 320, 264, "dgeglu", torch.float16, torch.float16),
        Case([512, 256], 160, 200, "dswiglu", torch.float32, torch.float32, tile_n=64),
        Case([256] * 128, 64, 64, "dswiglu"),  # L = 128
        Case(pareto_groups(32, 512), 256, 384, "dgeglu", tile_n=128),  # skewed
        Case([1024, 0, 0, 2048], 768, 1024, "dswiglu", dbias=False, tile_n=64),
        # many tiles per CTA (persistent walk, ping-pong order) with K >> stages * 64
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dgeglu", tile_n=128),
    ]
    return cases


def cluster_cases() -> list:
    """Clusters of 2 CTAs along M (B multicast): single expert, empty experts and N/K tails,
    an odd number of 256-row slabs per CTA walk, L = 128, mixed dtypes, tile 64, and a
    many-tile persistent walk."""
    return [
        Case([512], 256, 512, cluster_m=2),
        Case([256, 0, 768, 256], 96, 200, "dswiglu", cluster_m=2),
        Case([0, 512, 256], 320, 264, "dgeglu", cluster_m=2),
        Case([256] * 128, 64, 64, "dswiglu", cluster_m=2),
        Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False,
             tile_n=64, cluster_m=2),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dgeglu", cluster_m=2),
        # raster groups of 1 and 8 slabs (the default is 2): other tile orders, same results
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 320, 264, "dswiglu", cluster_m=2,
             raster_group_m=2),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 320, 264, "dswiglu", cluster_m=2,
             raster_group_m=16),
    ]


def cluster_2x2_cases() -> list:
    """2x2 clusters (A and B multicast): an odd N-tile count (the last pair half out of
    bounds), empty experts and N/K tails, L = 128, mixed dtypes with tile 64, dense N-major B,
    a many-tile walk, and another raster order."""
    return [
        Case([512], 384, 512, cluster_m=2, cluster_n=2),
        Case([256, 0, 768, 256], 96, 200, "dswiglu", cluster_m=2, cluster_n=2),
        Case([0, 512, 256], 320, 264, "dgeglu", cluster_m=2, cluster_n=2),
        Case([256] * 128, 256, 64, "dswiglu", cluster_m=2, cluster_n=2),
        Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False,
             tile_n=64, cluster_m=2, cluster_n=2),
        Case([256, 0, 768, 256], 352, 200, "dgeglu", b_major="n", cluster_m=2, cluster_n=2),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dswiglu", cluster_m=2,
             cluster_n=2),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 320, 264, "dgeglu", cluster_m=2,
             cluster_n=2, raster_group_m=16),
    ]


def cooperative_cases() -> list:
    """Cooperative schedule (both math warpgroups on one 128-row tile, 64 rows each): tile
    256 with an N tail inside the tile and N < tile, empty experts, K tails, L = 128, mixed
    dtypes (register D stores; fp16/fp32 D through shared memory), no dbias, 2x1 and 2x2
    clusters, dense N-major B, discrete B, tile 128/192, and a many-tile walk."""
    co = dict(cooperative=True)
    return [
        Case([512], 256, 512, tile_n=256, **co),
        Case([256, 0, 768, 256], 96, 200, "dswiglu", tile_n=256, **co),
        Case([256, 512, 256], 256, 192, "dswiglu", tile_n=256, cluster_m=2, signed_beta=True,
             **co),
        Case([0, 512, 256], 320, 264, "dgeglu", tile_n=256, cluster_m=2, **co),
        Case([256] * 128, 64, 64, "dswiglu", tile_n=128, **co),
        Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False,
             tile_n=256, cluster_m=2, **co),
        Case([512, 256], 160, 128, "dswiglu", torch.float16, torch.float32, tile_n=192, **co),
        Case([0, 512, 256], 320, 264, "dgeglu", torch.float16, torch.float16, tile_n=256, **co),
        Case([512, 256], 160, 200, "dswiglu", torch.float32, torch.float32, tile_n=128, **co),
        Case([256, 0, 768, 256], 352, 200, "dgeglu", b_major="n", tile_n=256, cluster_m=2,
             **co),
        Case([256, 0, 768, 256], 352, 200, "dswiglu", tile_n=256, cluster_m=2, cluster_n=2,
             **co),
        # one N-tile in 2x2 clusters: each pair's second tile is a phantom (no columns, no
        # dbias blocks on either side of the folder hand-off)
        Case([256, 0, 768, 256], 224, 200, "dgeglu", tile_n=256, cluster_m=2, cluster_n=2,
             **co),
        # three N-tiles in 2x2 clusters on a many-tile walk: the pairs' phantom fourth
        # N-tile comes between real tiles of the same CTA (a dbias hand-over count that
        # the phantom tile upsets shows in the tiles after it)
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 736, 200, "dswiglu", tile_n=256,
             cluster_m=2, cluster_n=2, **co),
        Case([256, 0, 768, 256], 288, 200, "dgeglu", weight_mode="discrete", b_major="n",
             tile_n=256, **co),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 768, 1416, "dswiglu", tile_n=256,
             cluster_m=2, **co),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dgeglu", dbias=False,
             tile_n=256, cluster_m=2, **co),
    ]


def split_cases() -> list:
    """The cooperative schedule's last round split along K (knob split_last), sized for the
    H200's 66 resident 2-CTA clusters and 132 single CTAs (``split_model`` says what each
    splits into on the device at hand; the test checks the kernel did, and that it split).
    The launch's grid is also bounded by the units M allows (the host does not read the
    offsets), so the small cases carry 16,384 rows past the last offset: without them a
    12-unit problem runs on 14 clusters and is not split.
    * 12 units, 66 clusters: no whole round; their 108 k-tiles over 36 clusters, 3 each,
      so every unit in 3 parts (head, middle, final: K 520, the last k-tile partial),
      finals waiting on parts that run at the same time; empty expert.
    * 100 units, 66 clusters: one whole round, 34 units left (as dsv3's 1,024 over 66
      leave 34), K 1416: 34 x 23 k-tiles over all 66 clusters, 11 or 12 each, so clusters
      run a unit's tail and the next one's head, and units come in 2 or 3 parts.
    * 150 units, 132 single CTAs: 18 left, 4 one-k-tile parts each (K 200), fp16 C and D,
      dGeGLU, no dbias.
    * discrete N-major B, 20 units in 2 parts; fp32 C and D (the epilogue's scalar shared
      memory path) in 3 parts of 1 or 2 k-tiles; K 128 (2 k-tiles) caps a split of 4 at
      2."""
    co = dict(cooperative=True)
    return [
        Case([512, 0, 768, 256], 512, 520, "dswiglu", tile_n=256, cluster_m=2, split_last=3,
             extra_rows=16384, **co),
        Case([2048, 256, 0, 2048, 1024, 512, 256, 256], 1024, 1416, "dswiglu", tile_n=256,
             cluster_m=2, split_last=3, signed_beta=True, **co),
        Case([2048, 256, 0, 2048, 1024, 512, 256, 256], 768, 200, "dgeglu", torch.float16,
             torch.float16, dbias=False, tile_n=256, split_last=4, **co),
        Case([256, 0, 768, 256], 288, 200, "dgeglu", weight_mode="discrete", b_major="n",
             tile_n=256, split_last=2, extra_rows=16384, **co),
        Case([512, 256], 160, 200, "dswiglu", torch.float32, torch.float32, tile_n=128,
             split_last=3, extra_rows=16384, **co),
        Case([512, 0, 768, 256], 512, 128, "dgeglu", tile_n=256, cluster_m=2, split_last=4,
             extra_rows=16384, **co),
    ]


def dense_n_major_cases() -> list:
    """Dense N-major B (the GroupedGluMLP backward passes w2^T): both cluster sizes, tails."""
    return [
        Case([256, 0, 768, 256], 96, 200, "dswiglu", b_major="n", cluster_m=2),
        Case([0, 512, 256], 320, 264, "dgeglu", b_major="n", cluster_m=1),
        Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False,
             tile_n=64, b_major="n", cluster_m=2),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dswiglu", b_major="n",
             cluster_m=2),
    ]


def discrete_cases() -> list:
    """Discrete B (b_ptrs), K- and N-major: empty experts, rows past the last offset, N and
    K tails, both tiles, both activations, mixed C/D dtypes, a many-tile persistent walk."""
    out = []
    for bm in ("k", "n"):
        out += [
            Case([256, 0, 768, 256], 96, 200, "dswiglu", weight_mode="discrete", b_major=bm),
            Case([0, 512, 256], 320, 264, "dgeglu", weight_mode="discrete", b_major=bm),
            Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False,
                 tile_n=64, weight_mode="discrete", b_major=bm),
            Case([256] * 64, 64, 64, "dswiglu", weight_mode="discrete", b_major=bm),
            Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dgeglu",
                 weight_mode="discrete", b_major=bm),
            # 2x1 clusters: the CTA pair multicasts its expert's B through one descriptor
            Case([256, 0, 768, 256], 96, 200, "dswiglu", weight_mode="discrete", b_major=bm,
                 cluster_m=2),
            Case([512, 256], 160, 128, "dgeglu", torch.float32, torch.float16, dbias=False,
                 tile_n=64, weight_mode="discrete", b_major=bm, cluster_m=2),
            Case([256] * 64, 64, 64, "dswiglu", weight_mode="discrete", b_major=bm, cluster_m=2),
            Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dgeglu",
                 weight_mode="discrete", b_major=bm, cluster_m=2),
        ]
    return out


def c_stage_cases() -> list:
    """Ping-pong with 2 C blocks in flight per warpgroup and dbias: the C producer hands a
    stage's column sums back knowing the current and the previous tile, so with tile 64 (2
    blocks per tile) every hand-back is the previous tile's; many tiles per warpgroup, empty
    experts, N tails, fp32 D (no D store in the hand-back)."""
    return [
        Case([2048] * 8, 480, 136, "dgeglu", tile_n=128, cluster_m=2, c_stages=2),
        Case([256, 0, 768, 256] * 8, 352, 200, "dswiglu", tile_n=64, c_stages=2),
        Case([256, 0, 768, 256] * 8, 352, 200, "dgeglu", torch.bfloat16, torch.float32,
             tile_n=64, cluster_m=2, c_stages=2),
    ]


def c_half_cases() -> list:
    """Ping-pong C ring entries of 64 rows (knob c_split 2; each C block loaded, computed,
    released and stored in two row halves): dbias on and off, fp32 D (register stores: no D
    store in the hand-back), 2 C blocks per warpgroup (4 entries), 2x2 clusters, discrete
    weights, tile 64 with fp16 C/D, N-major B, N tails, empty experts, signed beta, and
    walks of many tiles per warpgroup (every entry handed back across tiles); last, one
    c_split 1 case for the C producer's fallback when its ring is deeper than a tile."""
    return [
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 768, 1416, "dswiglu", tile_n=128,
             cluster_m=2, c_split=2),
        Case([256, 0, 768, 256] * 8, 352, 200, "dgeglu", tile_n=128, dbias=False, c_split=2),
        Case([256, 0, 768, 256] * 8, 352, 200, "dswiglu", torch.bfloat16, torch.float32,
             tile_n=128, cluster_m=2, c_split=2),
        Case([2048] * 8, 480, 136, "dgeglu", tile_n=128, cluster_m=2, c_stages=2, c_split=2,
             signed_beta=True),
        Case([512, 0, 768], 160, 200, "dswiglu", torch.float16, torch.float16, tile_n=64,
             cluster_m=2, c_split=2),
        Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, b_major="n", cluster_m=2,
             c_split=2),
        # tile 64 with 2 C blocks: 4 entries per warpgroup, every hand-back the previous tile's
        Case([256, 0, 768, 256] * 8, 352, 200, "dswiglu", tile_n=64, c_stages=2, c_split=2),
        Case([512, 256] * 4, 352, 200, "dgeglu", torch.float32, torch.bfloat16, tile_n=128,
             cluster_m=2, c_split=2),
        # 2x2 clusters (A multicast too): an odd N-tile count (the last pair's second tile a
        # phantom: TMA zero-fills its C loads, drops its D stores, dbias skips its columns),
        # and a many-tile walk
        Case([256, 0, 768, 256] * 8, 352, 200, "dswiglu", tile_n=128, cluster_m=2, cluster_n=2,
             c_split=2),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dgeglu", tile_n=128,
             cluster_m=2, cluster_n=2, c_split=2),
        # discrete weights (per-expert descriptors), K- and N-major, alone and in 2x1 clusters
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dswiglu", tile_n=128,
             weight_mode="discrete", cluster_m=2, c_split=2),
        Case([256, 0, 768, 256] * 8, 352, 200, "dgeglu", tile_n=128, weight_mode="discrete",
             b_major="n", c_split=2),
        # (c_split 1) tile 32 with 2 C stages, no dbias: the ring is deeper than a tile, and
        # the D store finds its tile from the FIFO position
        Case([256, 0, 768, 256] * 8, 352, 200, "dgeglu", tile_n=32, cluster_m=2, c_stages=2,
             dbias=False),
    ]


def split_unspread_case() -> Case:
    """split_last 3 where the last round is not spread: 63 slabs x 2 N-tiles = 126 units on
    the H200's 66 2-CTA clusters leave 60, whose ranges over 66 clusters would be 0.91 of a
    unit (``tile_walk.last_round_split`` wants 3/4 at most), so they run whole."""
    return Case([4096, 4096, 0, 4096, 3840], 512, 520, "dswiglu", tile_n=256, cluster_m=2,
                split_last=3, cooperative=True)


def activation_cases() -> list:
    """The activation output and round_dgrad_to_input_dtype on every schedule: ping-pong
    with register D stores and with 64-row C entries (D through shared memory), 2x2
    clusters, cooperative 128 x 256 with an N tail, the split last round, discrete weights,
    the ragged schedule; dGeGLU, dSwiGLU (whose stored value carries beta^2: beta in [0.5,
    1.5], 0 and -1.3 with signed_beta) and dSiTU-GLU; empty experts, N and K tails, rows
    past the last offset; dSwiGLU and fp32 C/D with round_dgrad alone. Every case with the
    activation output runs in both of its forms: register stores and (D of C's type) staged
    through shared memory with TMA stores; the ragged schedule at tile 128 staged only (the
    register form's masked stores spill there)."""
    base = _activation_base_cases()
    staged = [dataclasses.replace(c, act_staged=True) for c in base
              if c.activation and c.d_dtype == c.c_dtype]
    ragged128 = [Case([8, 0, 120, 1000, 16], 96, 200, act, activation=True, act_staged=True,
                      m_aligned=8, c_split=2) for act in ("dswiglu", "dgeglu")]
    return base + staged + ragged128


def _activation_base_cases() -> list:
    co = dict(cooperative=True)
    return [
        Case([256, 0, 768, 256], 96, 200, "dgeglu", activation=True),
        Case([256, 0, 768, 256], 96, 200, "dgeglu", activation=True, round_dgrad=True,
             c_split=2, cluster_m=2),
        Case([0, 512, 256], 320, 264, "dgeglu", dbias=False, activation=True, cluster_m=2,
             cluster_n=2, signed_beta=True),
        Case([0, 512, 256], 320, 264, "dgeglu", activation=True, round_dgrad=True,
             tile_n=256, cluster_m=2, **co),
        Case([512, 0, 768, 256], 512, 520, "dgeglu", activation=True, tile_n=256, cluster_m=2,
             split_last=3, extra_rows=16384, **co),
        Case([256, 0, 768, 256], 96, 200, "dgeglu", activation=True, round_dgrad=True,
             weight_mode="discrete", b_major="n"),
        Case([256, 0, 768, 256], 96, 200, "dswiglu", activation=True, round_dgrad=True,
             c_split=2, cluster_m=2, signed_beta=True),
        Case([0, 512, 256], 320, 264, "dswiglu", activation=True, tile_n=256, cluster_m=2,
             split_last=3, extra_rows=16384, **co),
        Case([256, 0, 768, 256], 96, 200, "dswiglu", activation=True, weight_mode="discrete",
             b_major="n", signed_beta=True),
        Case([8, 0, 120, 1000, 16], 96, 200, "dswiglu", activation=True, tile_n=64,
             m_aligned=8),
        Case([256, 0, 768, 256], 96, 200, "dsituglu", activation=True, cluster_m=2,
             signed_beta=True),
        Case([0, 512, 256], 320, 264, "dsituglu", activation=True, tile_n=256, cluster_m=2,
             **co),
        Case([8, 0, 120, 1000, 16], 96, 200, "dsituglu", activation=True, tile_n=64,
             m_aligned=8),
        Case([512, 256], 160, 200, "dswiglu", torch.float32, torch.float32, round_dgrad=True,
             tile_n=64),
        Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 512, 1416, "dswiglu", round_dgrad=True,
             cluster_m=2),
    ]


def situglu_cases() -> list:
    """dSiTU-GLU (beta1 4, beta2 25) in the kernel on bf16 operands, straight through the plan
    (the engines offer it for block-scaled operands only, dequantized to exactly these): every
    schedule (ping-pong with register D stores and with 64-row C entries, 2x2 clusters,
    cooperative with an N tail, the split last round, discrete weights), fp32 C and D, beta 0
    and negative (signed_beta), dbias."""
    co = dict(cooperative=True)
    return [
        Case([256, 0, 768, 256], 96, 200, "dsituglu"),
        Case([256, 0, 768, 256], 320, 264, "dsituglu", c_split=2, cluster_m=2),
        Case([0, 512, 256], 320, 264, "dsituglu", dbias=False, cluster_m=2, cluster_n=2,
             signed_beta=True),
        Case([0, 512, 256], 320, 264, "dsituglu", tile_n=256, cluster_m=2, **co),
        Case([512, 0, 768, 256], 512, 520, "dsituglu", tile_n=256, cluster_m=2, split_last=3,
             extra_rows=16384, **co),
        Case([256, 0, 768, 256], 96, 200, "dsituglu", torch.float32, torch.float32,
             weight_mode="discrete", b_major="n", tile_n=64),
    ]


def ragged_cases() -> list:
    """Offsets aligned to 8-128 rows (the ragged schedule: each expert's own tiles, the last
    one partial, its rows past the expert's end masked): experts of 8 rows, of one row short
    of and one past a tile, empty ones first, in the middle and last; N and K tails; both
    activations and signed beta; fp32 D (register stores) and fp16 C/D; dbias off; the
    activation output; discrete weights, K- and N-major; cooperative 128 x 256 with and
    without the split last round; 64-row C entries and 2 C stages; 2x1 and 2x2 clusters (a
    pair's second tile wholly past its expert's end: experts of 8 to 256 rows), alone, with
    discrete weights and cooperative; L = 128 of 8 rows each; a many-tile walk. A and C rows
    past the last offset hold NaN."""
    co = dict(cooperative=True)
    odd = [8, 0, 136, 120, 264, 0, 504, 8]
    return [
        Case(odd, 96, 200, "dswiglu", m_aligned=8),
        Case([0, 8] + odd, 320, 264, "dgeglu", m_aligned=8, signed_beta=True),
        Case([16, 48, 0, 144], 128, 192, "dswiglu", torch.bfloat16, torch.float32, m_aligned=16),
        Case([32, 96, 224, 0], 160, 128, "dgeglu", torch.float16, torch.float16, m_aligned=32),
        Case([64, 192, 0, 320], 160, 200, "dswiglu", dbias=False, tile_n=64, m_aligned=64),
        Case([128, 384, 0, 640, 128], 352, 200, "dgeglu", m_aligned=128),
        Case(odd, 96, 200, "dgeglu", activation=True, tile_n=64, m_aligned=8),
        Case(odd, 96, 200, "dswiglu", weight_mode="discrete", m_aligned=8),
        Case(odd, 160, 264, "dgeglu", weight_mode="discrete", b_major="n", m_aligned=8),
        Case(odd, 320, 264, "dswiglu", tile_n=256, m_aligned=8, **co),
        Case([1000, 8, 0, 2040, 520, 1304, 8, 2000], 512, 1416, "dgeglu", tile_n=256,
             split_last=3, extra_rows=16384, m_aligned=8, **co),
        Case(odd * 4, 352, 200, "dswiglu", c_split=2, m_aligned=8),
        Case(odd * 4, 352, 200, "dgeglu", tile_n=64, c_stages=2, m_aligned=8),
        Case([8] * 128, 64, 64, "dswiglu", m_aligned=8),
        Case(odd, 96, 200, "dswiglu", cluster_m=2, c_split=2, m_aligned=8),
        Case(odd, 352, 200, "dgeglu", torch.bfloat16, torch.float32, cluster_m=2, cluster_n=2,
             m_aligned=8),
        Case(odd, 160, 264, "dgeglu", weight_mode="discrete", b_major="n", cluster_m=2,
             m_aligned=8),
        Case(odd, 320, 264, "dswiglu", tile_n=256, cluster_m=2, m_aligned=8, **co),
        Case([1000, 8, 0, 2040, 520, 1304, 8, 2000], 512, 1416, "dgeglu", tile_n=256,
             cluster_m=2, split_last=3, extra_rows=16384, m_aligned=8, **co),
        Case([8] * 128, 64, 64, "dswiglu", cluster_m=2, m_aligned=8),
        Case([1000, 8, 0, 4088, 1032, 504, 248, 2040], 512, 1416, "dgeglu", cluster_m=2,
             m_aligned=8),
        Case([1000, 8, 0, 4088, 1032, 504, 248, 2040], 512, 1416, "dgeglu", m_aligned=8),
    ]


def any_size_cases() -> list:
    """Groups of any size (``m_aligned`` 1: the offsets and M need no alignment): 1-row
    experts, empty ones first, inside and last, an expert one row past a tile and one of
    several tiles, M odd (rows past the last offset: an odd count, NaN in A and C); both
    activations, fp32 and fp16 D, the activation output, discrete weights K- and N-major,
    2x1 and 2x2 clusters, cooperative with the split last round, L = 128 of 1..3 rows."""
    co = dict(cooperative=True)
    ones = [1, 0, 129, 3, 257, 0, 500, 1]
    return [
        Case(ones, 96, 200, "dswiglu", extra_rows=5, m_aligned=1),
        Case([0, 1] + ones, 320, 264, "dgeglu", extra_rows=3, m_aligned=1, signed_beta=True),
        Case([7, 45, 0, 131], 128, 192, "dswiglu", torch.bfloat16, torch.float32, extra_rows=1,
             m_aligned=1),
        Case([33, 95, 221, 0], 160, 128, "dgeglu", torch.float16, torch.float16, extra_rows=0,
             m_aligned=1),
        Case(ones, 96, 200, "dgeglu", activation=True, tile_n=64, extra_rows=7, m_aligned=1),
        Case(ones, 96, 200, "dswiglu", weight_mode="discrete", extra_rows=9, m_aligned=1),
        Case(ones, 160, 264, "dgeglu", weight_mode="discrete", b_major="n", extra_rows=9,
             m_aligned=1),
        Case(ones, 352, 200, "dgeglu", torch.bfloat16, torch.float32, cluster_m=2, cluster_n=2,
             extra_rows=3, m_aligned=1),
        Case(ones, 96, 200, "dswiglu", cluster_m=2, extra_rows=3, m_aligned=1),
        Case([999, 1, 0, 2041, 517, 1301, 3, 2001], 512, 1416, "dgeglu", tile_n=256,
             split_last=3, extra_rows=16383, m_aligned=1, **co),
        Case([1 + i % 3 for i in range(128)], 64, 64, "dswiglu", extra_rows=1, m_aligned=1),
    ]
