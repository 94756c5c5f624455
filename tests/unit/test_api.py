"""The vendor-compatible surface: TupleDict, the aliases running the page's BF16 examples
unchanged, the wrapper's return conventions, class-API reuse across token counts, and the CLI.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cudnn_ext
from cudnn_ext import TupleDict

from oracle import expert_weights_from_dense, oracle

BF16 = torch.bfloat16
REPO = Path(__file__).resolve().parents[2]
KEYS = ("d_row_tensor", "d_col_tensor", "dprob_tensor", "dbias_tensor", "amax_tensor", "sfd_row_tensor",
        "sfd_col_tensor")


def rel_err(got, ref):
    got, ref = got.double().reshape(ref.shape), ref.double()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------- TupleDict
def sample_td():
    return TupleDict({k: i for i, k in enumerate(KEYS)})


def test_tupledict_unpacks_values_in_order():
    d_row, d_col, dprob, dbias, amax, sfd_row, sfd_col = sample_td()
    assert (d_row, d_col, dprob, dbias, amax, sfd_row, sfd_col) == tuple(range(7))
    assert list(sample_td()) == list(range(7))  # iteration yields values, not keys
    assert tuple(sample_td()) == tuple(range(7))
    with pytest.raises(ValueError):
        a, b = sample_td()


def test_tupledict_dict_and_positional_access():
    td = sample_td()
    assert isinstance(td, dict)
    assert td["dprob_tensor"] == 2 and td["sfd_col_tensor"] == 6
    assert td[0] == 0 and td[6] == 6 and td[-1] == 6
    with pytest.raises(IndexError):
        td[7]
    with pytest.raises(IndexError):
        td[-8]
    with pytest.raises(KeyError):
        td["nope"]
    assert list(td.keys()) == list(KEYS)
    assert list(td.values()) == list(range(7))
    assert dict(td.items()) == {k: i for i, k in enumerate(KEYS)}
    assert len(td) == 7 and "amax_tensor" in td


def test_tupledict_equality_and_unhashable():
    assert sample_td() == sample_td()
    assert sample_td() == {k: i for i, k in enumerate(KEYS)}  # dict equality
    other = sample_td()
    other["amax_tensor"] = 99
    assert sample_td() != other
    with pytest.raises(TypeError):
        hash(sample_td())
    with pytest.raises(TypeError):
        {sample_td()}


# --------------------------------------------------------------------------- shared inputs
def moe_inputs(seed=0, sizes=(512, 0, 256), n=64, k=128, extra=256):
    g = torch.Generator().manual_seed(seed)
    L = len(sizes)
    offsets = torch.tensor(sizes).cumsum(0).to(torch.int32)
    m = int(offsets[-1]) + extra
    a = torch.randn(m, k, 1, generator=g).to(BF16)
    b = (torch.randn(L, n, k, generator=g) / k ** 0.5).to(BF16).permute(1, 2, 0)
    c = (torch.randn(m, 2 * n, 1, generator=g) * 3).to(BF16)
    alpha = torch.rand(L, generator=g) + 0.5
    beta = torch.rand(L, generator=g) + 0.5
    prob = torch.rand(m, 1, 1, generator=g)
    return dict(a=a, b=b, c=c, padded_offsets=offsets, alpha=alpha, beta=beta, prob=prob, N=n, L=L, m=m)


def ref_for(x, **kw):
    return oracle(x["a"][..., 0], expert_weights_from_dense(x["b"]), x["c"][..., 0], x["padded_offsets"],
                  x["alpha"], x["beta"], x["prob"], **kw)


# --------------------------------------------------------------------------- the page's examples
# Copied verbatim from the vendor page (grouped_gemm_dglu_sm100.md, "API usage / BF16"); only
# the module is cudnn_ext (``import cudnn_ext as cudnn``).
PAGE_WRAPPER_EXAMPLE = '''
import cudnn
import torch

dprob.zero_()
out = cudnn.grouped_gemm_dglu_wrapper_sm100(
    a_tensor=a,
    c_tensor=c,
    sfa_tensor=None,
    padded_offsets=padded_offsets,
    alpha_tensor=alpha,
    beta_tensor=beta,
    prob_tensor=prob,
    dprob_tensor=dprob,
    b_tensor=b,
    sfb_tensor=None,
    act_func="dswiglu",
    generate_dbias=True,
    use_dynamic_sched=True,
)
d_row, d_col, dprob, dbias, amax, sfd_row, sfd_col = out

# Discrete mode replaces the dense weight arguments.
out = cudnn.grouped_gemm_dglu_wrapper_sm100(
    a_tensor=a, c_tensor=c, sfa_tensor=None,
    padded_offsets=padded_offsets, alpha_tensor=alpha, beta_tensor=beta,
    prob_tensor=prob, dprob_tensor=dprob,
    b_ptrs=b_ptrs, sfb_ptrs=None, n=N, b_dtype=torch.bfloat16,
    act_func="dgeglu",
)
'''

PAGE_CLASS_EXAMPLE = '''
op = cudnn.GroupedGemmDgluSm100(
    sample_a=a, sample_c=c, sample_d_row=d_row, sample_d_col=None,
    sample_sfa=None, sample_padded_offsets=padded_offsets,
    sample_alpha=alpha, sample_beta=beta, sample_prob=prob,
    sample_dprob=dprob, sample_dbias=dbias,
    sample_b=b, sample_sfb=None, act_func="dswiglu",
)
assert op.check_support()
op.compile()
dprob.zero_()
dbias.zero_()
op.execute(
    a_tensor=a, c_tensor=c, d_row_tensor=d_row, d_col_tensor=None,
    sfa_tensor=None, padded_offsets=padded_offsets, alpha_tensor=alpha,
    beta_tensor=beta, prob_tensor=prob, dprob_tensor=dprob,
    dbias_tensor=dbias, b_tensor=b, sfb_tensor=None,
)
'''


def as_cudnn_ext(snippet: str) -> str:
    assert "import cudnn\n" in snippet
    return snippet.replace("import cudnn\n", "import cudnn_ext as cudnn\n")


def test_aliases_are_the_same_objects():
    assert cudnn_ext.grouped_gemm_dglu_wrapper_sm100 is cudnn_ext.grouped_gemm_dglu_wrapper
    assert cudnn_ext.GroupedGemmDgluSm100 is cudnn_ext.GroupedGemmDglu


def test_page_bf16_wrapper_example_runs_unchanged():
    x = moe_inputs(seed=1)
    keep = [x["b"][:, :, e].contiguous() for e in range(x["L"])]  # per-expert K-major (N, K)
    dprob = torch.full((x["m"], 1, 1), 123.0)  # the example zeroes it itself
    ns = dict(a=x["a"], c=x["c"], padded_offsets=x["padded_offsets"], alpha=x["alpha"], beta=x["beta"],
              prob=x["prob"], dprob=dprob, b=x["b"], N=x["N"],
              b_ptrs=torch.tensor([t.data_ptr() for t in keep], dtype=torch.int64))
    exec(as_cudnn_ext(PAGE_WRAPPER_EXAMPLE), ns)
    assert ns["cudnn"] is cudnn_ext
    e = int(x["padded_offsets"][-1])
    swi = ref_for(x, act_func="dswiglu")
    geg = ref_for(x, act_func="dgeglu")
    # first call: dense dSwiGLU with dbias; BF16 block-scaled slots are None
    assert ns["d_col"] is None and ns["amax"] is None and ns["sfd_row"] is None and ns["sfd_col"] is None
    assert ns["dprob"] is dprob
    assert rel_err(ns["d_row"][:e], swi["d"][:e]) < 8e-3
    assert rel_err(ns["dbias"], swi["dbias"]) < 8e-3
    # second call: discrete dGeGLU, accumulating into the same (not re-zeroed) dprob
    out = ns["out"]
    assert isinstance(out, TupleDict) and list(out.keys()) == list(KEYS)
    assert out["dprob_tensor"] is dprob and out["dbias_tensor"] is None
    assert rel_err(out["d_row_tensor"][:e], geg["d"][:e]) < 8e-3
    assert rel_err(dprob.view(-1), swi["dprob"] + geg["dprob"]) < 2e-5


def test_page_bf16_class_example_runs_unchanged():
    x = moe_inputs(seed=2)
    d_row = torch.full((x["m"], 2 * x["N"], 1), -1.0, dtype=BF16)
    dprob = torch.full((x["m"], 1, 1), 5.0)
    dbias = torch.full((x["L"], 2 * x["N"], 1), 5.0, dtype=BF16)
    ns = dict(cudnn=cudnn_ext, a=x["a"], c=x["c"], padded_offsets=x["padded_offsets"], alpha=x["alpha"],
              beta=x["beta"], prob=x["prob"], dprob=dprob, dbias=dbias, b=x["b"], d_row=d_row)
    exec("import cudnn_ext as cudnn\n" + PAGE_CLASS_EXAMPLE, ns)
    assert isinstance(ns["op"], cudnn_ext.GroupedGemmDgluSm100)
    ref = ref_for(x)
    e = int(x["padded_offsets"][-1])
    assert rel_err(d_row[:e], ref["d"][:e]) < 8e-3
    assert (d_row[e:] == -1.0).all()  # rows past the last offset untouched
    assert rel_err(dprob.view(-1)[:e], ref["dprob"][:e]) < 2e-5
    assert (dprob[e:] == 0).all()  # zeroed by the example, never written
    assert rel_err(dbias, ref["dbias"]) < 8e-3


# --------------------------------------------------------------------------- wrapper conventions
def wrapper_call(x, dprob, **kw):
    return cudnn_ext.grouped_gemm_dglu_wrapper(
        a_tensor=x["a"], c_tensor=x["c"], sfa_tensor=None, padded_offsets=x["padded_offsets"],
        alpha_tensor=x["alpha"], beta_tensor=x["beta"], prob_tensor=x["prob"], dprob_tensor=dprob,
        b_tensor=x["b"], **kw)


def test_wrapper_returns_dprob_object_and_dbias_only_when_asked():
    x = moe_inputs(seed=3)
    dprob = torch.zeros(x["m"], 1, 1)
    out = wrapper_call(x, dprob)
    assert isinstance(out, TupleDict) and list(out.keys()) == list(KEYS)
    assert out["dprob_tensor"] is dprob and out[2] is dprob
    assert out["dbias_tensor"] is None and out["d_col_tensor"] is None and out["amax_tensor"] is None
    assert out["sfd_row_tensor"] is None and out["sfd_col_tensor"] is None
    d = out["d_row_tensor"]
    assert d.shape == (x["m"], 2 * x["N"], 1) and d.dtype == BF16
    assert d.stride()[:2] == (2 * x["N"], 1)  # N-major (the unit dim's stride is immaterial)
    out = wrapper_call(x, dprob, generate_dbias=True, d_dtype=torch.float32)
    assert out["dbias_tensor"].shape == (x["L"], 2 * x["N"], 1) and out["dbias_tensor"].dtype == BF16
    assert out["d_row_tensor"].dtype == torch.float32
    assert out["dbias_tensor"] is out[3]


def test_wrapper_appends_activation_tensor_last_when_given():
    x = moe_inputs(seed=4)
    act = torch.zeros(x["m"], x["N"], 1, dtype=BF16)
    out = wrapper_call(x, torch.zeros(x["m"], 1, 1), act_func="dgeglu", activation_tensor=act)
    assert list(out.keys()) == list(KEYS) + ["activation_tensor"]
    assert out["activation_tensor"] is act and out[7] is act and out[-1] is act
    *_, last = out
    assert last is act
    assert len(list(out)) == 8
    e = int(x["padded_offsets"][-1])
    assert rel_err(act[:e], ref_for(x, act_func="dgeglu")["activation"][:e]) < 8e-3
    no_act = wrapper_call(x, torch.zeros(x["m"], 1, 1), act_func="dgeglu")
    assert "activation_tensor" not in no_act and len(no_act) == 7


# --------------------------------------------------------------------------- class API reuse
def test_class_api_changes_m_without_recompiling():
    x = moe_inputs(seed=5, sizes=(256, 256), extra=0)
    n, L = x["N"], x["L"]

    def tensors(m):
        return dict(d_row=torch.zeros(m, 2 * n, 1, dtype=BF16), dprob=torch.zeros(m, 1, 1),
                    dbias=torch.zeros(L, 2 * n, 1, dtype=BF16))

    s = tensors(x["m"])
    op = cudnn_ext.GroupedGemmDgluSm100(
        sample_a=x["a"], sample_c=x["c"], sample_d_row=s["d_row"], sample_d_col=None, sample_sfa=None,
        sample_padded_offsets=x["padded_offsets"], sample_alpha=x["alpha"], sample_beta=x["beta"],
        sample_prob=x["prob"], sample_dprob=s["dprob"], sample_dbias=s["dbias"], sample_b=x["b"])
    op.compile()
    plan = op._plan
    for seed, sizes, extra in ((6, (768, 256), 0), (7, (0, 256), 256), (8, (512, 1024), 512)):
        y = moe_inputs(seed=seed, sizes=sizes, extra=extra)
        y["b"] = x["b"]  # same weights (N, K, L): only M changes
        t = tensors(y["m"])
        op.execute(a_tensor=y["a"], c_tensor=y["c"], d_row_tensor=t["d_row"], d_col_tensor=None, sfa_tensor=None,
                   padded_offsets=y["padded_offsets"], alpha_tensor=y["alpha"], beta_tensor=y["beta"],
                   prob_tensor=y["prob"], dprob_tensor=t["dprob"], dbias_tensor=t["dbias"], b_tensor=y["b"])
        assert op._plan is plan, "a new M rebuilt the plan"
        ref = ref_for(y)
        e = int(y["padded_offsets"][-1])
        assert rel_err(t["d_row"][:e], ref["d"][:e]) < 8e-3, f"M={y['m']} seed={seed}"
        assert rel_err(t["dprob"].view(-1), ref["dprob"]) < 2e-5, f"M={y['m']} seed={seed}"
        assert rel_err(t["dbias"], ref["dbias"]) < 8e-3, f"M={y['m']} seed={seed}"
    assert op.get_workspace_size() == plan.workspace_size


def test_wrapper_plan_is_cached_across_m():
    from cudnn_ext import contract
    from cudnn_ext.graph.from_call import graph_for_call

    plans = []
    for sizes in ((256,), (1024,)):
        x = moe_inputs(sizes=sizes, extra=0)
        problem, pack = contract.normalize(
            contract.Operands(a=x["a"], c=x["c"], padded_offsets=x["padded_offsets"], alpha=x["alpha"],
                              beta=x["beta"], prob=x["prob"], dprob=torch.zeros(x["m"], 1, 1), b=x["b"]),
            contract.CallConfig())
        plans.append((problem.m, graph_for_call(problem, pack).execution_plan))  # what the wrapper runs
    (m1, p1), (m2, p2) = plans
    assert m1 != m2 and p1 is p2


# --------------------------------------------------------------------------- CLI
def run_cli(*args, timeout=240):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "cudnn_ext", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_info():
    r = run_cli("info")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cudnn_ext" in r.stdout and "torch" in r.stdout
    assert "reference" in r.stdout and "can run" in r.stdout
    if not torch.cuda.is_available():
        assert "CPU only" in r.stdout
        assert "cannot run" in r.stdout  # GPU engines say why not


def test_cli_demo():
    r = run_cli("demo", "--iters", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "engine:" in r.stdout
    if not torch.cuda.is_available():
        assert "engine: reference" in r.stdout
    assert "max error" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "OK", r.stdout


def test_cli_rejects_unknown_command():
    r = run_cli("frobnicate")
    assert r.returncode != 0


@pytest.mark.parametrize("option,value", [("--experts", "0"), ("--iters", "0"), ("--rows", "-3"), ("--n", "x")])
def test_cli_demo_rejects_bad_sizes_with_a_usage_error(option, value):
    """A usage error naming the option (exit status 2), not a traceback from inside the demo."""
    from cudnn_ext import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", option, value])
    assert exc.value.code == 2


def test_cli_help_is_plain_text(capsys):
    from cudnn_ext import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "info" in out and "demo" in out


def test_class_api_explains_its_engine_choice():
    cudnn = cudnn_ext
    L, N, K, M = 2, 32, 64, 512
    offs = torch.tensor([256, 512], dtype=torch.int32)
    a = torch.randn(M, K).bfloat16()
    b = torch.randn(L, N, K).bfloat16().permute(1, 2, 0)
    c = torch.randn(M, 2 * N).bfloat16()
    d = torch.empty(M, 2 * N, dtype=torch.bfloat16)
    op = cudnn.GroupedGemmDglu(
        sample_a=a, sample_c=c, sample_d_row=d, sample_d_col=None, sample_sfa=None, sample_padded_offsets=offs,
        sample_alpha=torch.ones(L), sample_beta=torch.ones(L), sample_prob=torch.rand(M),
        sample_dprob=torch.zeros(M), sample_b=b)
    text = op.explain()
    first = text.splitlines()[1]
    assert "reference" in first  # on a CPU only the reference engine can run
    assert "engines that decline:" in text and "sm90" in text  # the Hopper engine says why not
