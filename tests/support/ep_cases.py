"""Expert-parallel cases, run on every rank of a process group: ``ExpertParallelGluMLP`` against
the single-process run of the same layer with all experts.

Every rank builds the same global problem from one seed (all ranks' tokens, routing and the
full ``GroupedGluMLP``), runs its own share through the expert-parallel layer and the whole
problem through ``reference_moe`` (a per-expert loop that does not use the layer's routing
code), and compares its tokens' outputs and gradients and its experts' weight gradients.

Both sides run the same bf16 ``GroupedGluMLP`` on the same rows in the same order per expert
(the expert-parallel receiver places rows source rank by source rank, which is global token
order), so on the CPU every output and gradient is bitwise equal (``TOL["cpu"]`` is 0) and the
loss, summed over ranks in another order, agrees to 1e-12 relative. On a GPU
the grouped GEMMs of a problem with other row totals may tile differently, so the check is
bf16's: ``TOL["cuda"]``, relative to each tensor's largest magnitude.

Run by tests/distributed/test_expert_parallel.py (forked CPU processes, gloo) and, on a GPU
host, as ``torchrun --nproc-per-node 2 tests/support/ep_cases.py`` (NCCL; see that test).
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

from cudnn_ext.torch.expert_parallel import ExpertParallelGluMLP
from cudnn_ext.torch.mlp import GroupedGluMLP

TOL = {"cpu": 0.0, "cuda": 2e-2}
LOSS_TOL = 1e-12  # the loss is a sum over ranks in another order than the reference's


def reference_moe(full: GroupedGluMLP, x, ids, probs):
    """The single-process layer: every (token, slot) pair of expert ``e`` in token order, each
    expert's rows padded with zero rows (probability 0) to a multiple of the layer's
    ``m_aligned``, one ``GroupedGluMLP`` call over all experts, each token's ``k`` outputs summed in fp32.
    (Host lists and one gather, on purpose unlike the layer's device-side routing.)"""
    t, k = ids.shape
    flat_ids = ids.reshape(-1).tolist()
    src, row_of_pair, ends, n = [], [0] * len(flat_ids), [], 0
    for e in range(full.num_experts):
        pairs = [i for i, v in enumerate(flat_ids) if v == e]
        for j, i in enumerate(pairs):
            row_of_pair[i] = n + j
        pad = -(-len(pairs) // full.m_aligned) * full.m_aligned
        src += pairs + [-1] * (pad - len(pairs))  # -1: a padding row
        n += pad
        ends.append(n)
    if n == 0:
        return x.new_zeros(x.shape)
    src_t = torch.tensor(src, device=x.device)
    is_pad = src_t < 0
    pair = src_t.clamp(min=0)
    rows_x = torch.where(is_pad[:, None], 0.0, x[pair // k])
    rows_p = torch.where(is_pad, 0.0, probs.reshape(-1)[pair])
    y = full(rows_x, rows_p, torch.tensor(ends, dtype=torch.int32, device=x.device))
    per_pair = y[torch.tensor(row_of_pair, device=x.device)].view(t, k, -1)
    acc = per_pair[:, 0].float()
    for slot in range(1, k):
        acc = acc + per_pair[:, slot].float()
    return acc.to(x.dtype)


def make_case(name, ep, device):
    """(global problem, per-rank token counts) of case ``name`` for a group of ``ep`` ranks."""
    g = torch.Generator().manual_seed(1234 + sum(map(ord, name)))
    L = max(2 * ep, 4)  # top3 needs at least 3 experts
    spec = {
        # uneven tokens and uneven routing (most pairs to the first rank's experts), top-2,
        # an expert with more than 256 rows (several row blocks), bias and clamped GeGLU
        "uneven_top2": dict(tokens=[300, 77, 150, 20][:ep], k=2, skew=[3.0, 0.0], act="geglu", bias=True),
        # the last rank's experts are never chosen: that rank receives no tokens
        "rank_receives_none": dict(tokens=[90, 200, 40, 60][:ep], k=2, skew=None, act="swiglu", bias=False,
                                   banned=list(range(L - 2, L))),
        # the first rank has no tokens at all; top-1
        "rank_sends_none": dict(tokens=[0, 130, 70, 33][:ep], k=1, skew=None, act="swiglu", bias=True),
        # top-3 over few experts: several of one token's pairs land on one rank
        "top3": dict(tokens=[64, 64, 64, 64][:ep], k=3, skew=None, act="swiglu", bias=False),
        # uneven_top2 with experts' groups aligned to 8 rows (m_aligned=8) instead of 256
        "uneven_top2_a8": dict(tokens=[300, 77, 150, 20][:ep], k=2, skew=[3.0, 0.0], act="geglu", bias=True,
                               m_aligned=8),
        # uneven_top2 with groups of any size (m_aligned=1): no padding rows at all
        "uneven_top2_a1": dict(tokens=[300, 77, 150, 20][:ep], k=2, skew=[3.0, 0.0], act="geglu", bias=True,
                               m_aligned=1),
    }[name]
    align = spec.get("m_aligned", 256)
    T, k, H, N = sum(spec["tokens"]), spec["k"], 64, 64
    scores = torch.rand(T, L, generator=g, dtype=torch.float64)
    if spec["skew"]:
        scores[:, : L // 2] += spec["skew"][0]
    for e in spec.get("banned", []):
        scores[:, e] = -1.0
    top, ids = scores.topk(k, dim=1)
    probs = torch.softmax(top, dim=1)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    full = GroupedGluMLP(L, H, N, activation=spec["act"], bias=spec["bias"], dtype=torch.float64,
                         m_aligned=align)
    if full.b1 is not None:
        with torch.no_grad():
            full.b1.normal_(0.0, 0.5)
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    upstream = torch.randn(T, H, generator=g, dtype=torch.float64)
    problem = dict(L=L, H=H, N=N, act=spec["act"], bias=spec["bias"], m_aligned=align, full=full.to(device),
                   x=x.to(device),
                   ids=ids.to(device), probs=probs.to(device), upstream=upstream.to(device))
    return problem, spec["tokens"]


def run_case(name, group=None, device="cpu"):
    """This rank's mismatches (a list of messages) for case ``name``; collective."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    P, tokens = make_case(name, ep, device)
    lo = sum(tokens[:rank])
    mine = slice(lo, lo + tokens[rank])

    full = P["full"]
    xr = P["x"].clone().requires_grad_()
    pr = P["probs"].clone().requires_grad_()
    y_ref = reference_moe(full, xr, P["ids"], pr)
    loss_ref = (y_ref * P["upstream"]).sum()
    if loss_ref.requires_grad:  # not when no rank has a token (the one-rank run of rank_sends_none)
        loss_ref.backward()

    layer = ExpertParallelGluMLP(P["L"], P["H"], P["N"], group=group, activation=P["act"], bias=P["bias"],
                                 dtype=torch.float64, device=device, m_aligned=P["m_aligned"])
    layer.copy_shard_from(full)
    x = P["x"][mine].clone().requires_grad_()
    probs = P["probs"][mine].clone().requires_grad_()
    ids = P["ids"][mine]
    y = layer(x, ids, probs)
    loss = (y * P["upstream"][mine]).sum()
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)

    lo_e, hi_e = layer.expert_range
    ref = lambda t: t.grad if t.grad is not None else torch.zeros_like(t)  # noqa: E731
    pairs = [("loss", total, loss_ref.detach()), ("y", y, y_ref[mine]), ("x.grad", x.grad, ref(xr)[mine]),
             ("probs.grad", probs.grad, ref(pr)[mine]),
             ("w1.grad", layer.experts.w1.grad, ref(full.w1)[lo_e:hi_e]),
             ("w2.grad", layer.experts.w2.grad, ref(full.w2)[lo_e:hi_e])]
    if P["bias"]:
        pairs.append(("b1.grad", layer.experts.b1.grad, ref(full.b1)[lo_e:hi_e]))
    bad = []
    for what, got, want in pairs:
        tol = max(TOL[torch.device(device).type], LOSS_TOL if what == "loss" else 0.0)
        if got is None:
            bad.append(f"{name} rank {rank}: {what} is None")
            continue
        scale = max(want.abs().max().item() if want.numel() else 0.0, 1e-30)
        err = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
        if got.shape != want.shape or err > tol * scale:
            bad.append(f"{name} rank {rank}: {what} differs by {err:.3g} (max |ref| {scale:.3g}, tol {tol})")
    # the comparison is not vacuous: the weights of experts that got rows have gradients
    got_rows = P["ids"].eq(torch.arange(lo_e, hi_e, device=device)[:, None, None]).flatten(1).any(1)
    nonzero = layer.experts.w1.grad.flatten(1).abs().amax(1) > 0
    if not torch.equal(got_rows, nonzero):
        bad.append(f"{name} rank {rank}: experts with rows {got_rows.tolist()}, nonzero w1.grad {nonzero.tolist()}")
    return bad


def run_bad_id(group=None, device="cpu"):
    """An out-of-range expert id on one rank: every rank raises the ValueError (none waits on a
    peer that left), and the group stays usable."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    layer = ExpertParallelGluMLP(2 * ep, 64, 64, group=group, dtype=torch.float64, device=device)
    ids = torch.zeros(5, 2, dtype=torch.long, device=device)
    ids[:, 1] = 1
    if rank == 0:
        ids[3, 1] = 2 * ep
    try:
        layer(torch.randn(5, 64, dtype=torch.float64, device=device), ids,
              torch.rand(5, 2, dtype=torch.float64, device=device))
    except ValueError as e:
        return [] if "expert_ids" in str(e) and "[0]" in str(e) else [f"rank {rank}: wrong message: {e}"]
    return [f"rank {rank}: an out-of-range id on rank 0 raised nothing here"]


def run_not_member(device="cpu"):
    """A rank outside the layer's group is refused by name (a group of rank 0 alone)."""
    solo = dist.new_group([0])  # collective: every rank creates it
    if dist.get_rank() == 0:
        ExpertParallelGluMLP(2, 64, 64, group=solo, device=device)  # a member: fine
        return []
    try:
        ExpertParallelGluMLP(2, 64, 64, group=solo, device=device)
    except ValueError as e:
        return [] if "group: this rank is not a member" in str(e) else [f"wrong message: {e}"]
    return [f"rank {dist.get_rank()}: built a layer over a group it is not in"]


CASES = ("uneven_top2", "rank_receives_none", "rank_sends_none", "top3", "uneven_top2_a8", "uneven_top2_a1")


def run_all(device="cpu"):
    """Every case on the initialized default group; raises AssertionError on every rank with all
    ranks' mismatches (gathered, so no rank stops while a peer waits in a collective)."""
    results = []
    for name in CASES:
        results.append(run_case(name, device=device))
    results.append(run_bad_id(device=device))
    if dist.get_world_size() > 1:
        results.append(run_not_member(device=device))
    mine = [m for r in results for m in r]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    failures = [m for ms in everyone for m in ms]
    if failures:
        raise AssertionError("\n".join(failures))


def spawned(rank, world, init_file):
    """Entry of a forked CPU process (tests/distributed)."""
    torch.set_num_threads(1)  # a few tiny GEMMs per case; the ranks share the runner's cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        run_all("cpu")
    finally:
        dist.destroy_process_group()


def main():
    """torchrun entry: NCCL on one GPU per rank (gloo on the CPU with ``--cpu``)."""
    on_cpu = "--cpu" in sys.argv[1:]
    if on_cpu:
        device = "cpu"
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = f"cuda:{torch.cuda.current_device()}"
    dist.init_process_group("gloo" if on_cpu else "nccl", timeout=datetime.timedelta(seconds=120))
    try:
        run_all(device)
        if dist.get_rank() == 0:
            print(f"expert parallel: {len(CASES)} cases + bad id + non-member OK on {dist.get_world_size()} ranks ({device})")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
