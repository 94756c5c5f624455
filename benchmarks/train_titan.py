"""A real TorchTitan training run, stock experts against cudnn_ext's swapped experts.

TorchTitan's DeepSeek-V3 model (``torchtitan.models.deepseek_v3.model_registry``), built twice
from one seed: once as it comes (TorchTitan's ``GroupedExperts``) and once with
``cudnn_ext.integrations.torchtitan.swap_experts`` (``CudnnGroupedExperts``: the fused grouped
GEMM + dSwiGLU backward). Both train on the same token stream, one after the other, and the
script compares their loss curves, tokens/s and peak memory, then checks that each one's
checkpoint loads into the other.

What is TorchTitan's and what is not:

* **Model.** ``model_registry("debugmodel")`` (``--config debugmodel``), or that config with
  its layers rebuilt by TorchTitan's ``build_mla_moe_layers`` at the qwen3 expert shape of
  ``bench_moe_layer.py`` (``--config experts``: dim 2048, 32 experts of width 768, top-8, no
  shared experts, 8 attention heads; the debug model's depth, dense first layer, vocabulary
  and initializers), so that the routed experts are most of a step's FLOPs (61% by
  TorchTitan's count at seq_len 2048, against 3% in the debug model; ``model`` in the JSON).
  Built as the trainer builds it: on the meta device, ``to_empty`` on the device,
  ``init_weights`` after ``torch.manual_seed(seed)``.
* **Attention.** ``--attn auto`` is FlexAttention on CUDA (TorchTitan's default backend, the
  causal + per-document block mask from ``model.get_attention_masks``) where this torch builds
  TorchTitan's block masks, else TorchTitan's ``ScaledDotProductAttention`` (causal), as on
  the CPU: FlexAttention has no CPU backward and
  varlen attention (flash) is CUDA-only. With one document per row (positions ``0..L-1``),
  as here, the document mask is the causal mask, so the two compute the same attention.
* **Precision.** What TorchTitan does on one GPU: it always applies FSDP2, on a one-rank mesh,
  with ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
  (``training.mixed_precision_param``/``_reduce``; ``training.dtype`` float32). So the
  parameters, gradients and AdamW states are fp32; each step computes with bf16 copies of the
  parameters and their bf16 gradients are cast to fp32. This script does the same without a
  process group (:class:`Bf16Compute`; FSDP on one rank adds no other arithmetic).
  Buffers (RoPE tables, expert biases) stay as they are, as under FSDP.
* **Optimizer.** TorchTitan's ``deepseek_v3_debugmodel`` trainer config, built with
  TorchTitan's own classes: AdamW lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
  (fused); its LR schedule (2 warm-up steps, then linear decay to 0 over the last 80% of the
  steps); gradient clipping at ``training.max_norm`` (1.0); and the MoE load-balancing hook
  that moves the expert biases before each optimizer step.
* **Loss.** TorchTitan's ``CrossEntropyLoss``: the summed cross-entropy of fp32 logits over
  the step's valid tokens. The trainer wraps it in ``ChunkedLossWrapper``, which applies the
  output layer chunk by chunk to save memory and gives the same loss.
* **Data.** TorchTitan's datasets cannot be fetched offline. The tokens are a fixed seeded
  stream from a random sparse bigram chain (each token has a few successors, so the loss has
  something to learn: it falls from ln(vocab) towards the chain's entropy); inputs are a
  row's first ``seq_len`` tokens and targets the next ones, as TorchTitan's loader makes them.
* **Not applied:** activation checkpointing and ``torch.compile`` (the trainer config's
  selective AC; compile is off by default) and the ``update_from_config`` of parallelism.

Agreement (``agrees`` in the JSON): the stock and swapped runs compute the same function in
bf16 with different roundings, and where the router's scores are near a tie a token goes to
another expert, so the curves part slowly. A wrong gradient (a wrong dSwiGLU, a misplaced
gate/up block) parts them within a few steps, and a slightly wrong one shows as a drift by
the end. So: every loss finite, within a relative 2% of the stock loss at each of
the first 50 steps, and the mean of the last 20 losses within a relative 2% of the stock
mean. (On the CPU, 100 steps of the debug model at batch 8 x 64 tokens, the curves stayed
within 0.04% of each other.) ``--control`` also trains the stock model from weights perturbed by a
bf16 rounding's size and reports how far it parts from stock by the same measures
(``control`` in the JSON, a dotted curve in the plot): what rounding alone does to the run.
With it, each bar becomes the larger of the fixed one and CONTROL_MARGIN (1.5) times the
control's own value: where a run is chaotic (a loss spike that a 2^-9 perturbation of the
weights moves by 10%), swapped must part from stock no more than stock parts from itself. The script exits 1 if the curves do not agree or a checkpoint
does not round-trip; with ``--smoke`` only the second counts (the mechanics, on the CPU).

Checkpoints (``checkpoint_round_trip``): each trained model's ``state_dict`` is saved with
``torch.save`` (to a temporary directory) and loaded (``strict=True``) into a freshly built
model of the other kind; the loaded weights must equal the saved ones exactly, and the logits
on a fixed batch must match the source model's within a relative 2% (Frobenius norm; bf16
compute, different expert arithmetic; 0.4% on the CPU run above).

Results: JSON to ``benchmarks/results/train-titan-<device>.json`` (spaces as underscores),
the loss curves to ``docs/training.png`` (needs matplotlib; skipped with a message without
it). ``--smoke`` runs a few steps of the config's first two layers on the CPU at a tiny
sequence length and writes only where ``--out``/``--plot`` say. Not imported by the library.

  python3 benchmarks/train_titan.py --config debugmodel --steps 200
  python3 benchmarks/train_titan.py --config experts --steps 200
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.func import functional_call

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("debugmodel", "experts")
ATTN_BACKENDS = ("auto", "flex", "varlen", "sdpa")

#: the qwen3 expert shape of bench_moe_layer.py / bench_dglu.SHAPES (Qwen3-30B-A3B's experts)
EXPERTS_SHAPE = dict(dim=2048, moe_hidden_dim=768, num_experts=32, top_k=8)
#: the experts config's dense first layer: as wide as a token's routed experts (top_k x 768)
EXPERTS_DENSE_HIDDEN = EXPERTS_SHAPE["top_k"] * EXPERTS_SHAPE["moe_hidden_dim"]
#: the experts config's attention heads: half the debug model's 16, so that attention (at
#: seq_len 2048) stays below the routed experts
EXPERTS_HEADS = 8

#: per-config (batch, seq_len): TorchTitan's debugmodel trainer config (8 x 2048); the
#: experts config at half the batch (its MoE layers route 4 x 2048 x 8 rows: 2048 per expert)
DEFAULT_SHAPE = {"debugmodel": (8, 2048), "experts": (4, 2048)}
SMOKE_SHAPE = (2, 16)
SMOKE_STEPS = 3
SMOKE_LAYERS = 2  # the debug model's dense first layer and one MoE layer: every kind of block, 3x faster
#: the control run's start: the stock weights times 1 + 2^CONTROL_LOG2 N(0, 1) (bf16's half ulp is 2^-9)
CONTROL_LOG2 = -9
WARMUP_STEPS = 5  # steps left out of tokens/s: flex's compile, the fused op's plans, the allocator

#: the chain's successors per token and their probabilities (entropy about 1.2 nats)
BIGRAM_SUCCESSORS = (0.5, 0.25, 0.15, 0.1)

#: agreement of the loss curves (see the module docstring)
EARLY_STEPS = 50
EARLY_RTOL = 0.02
FINAL_WINDOW = 20
FINAL_RTOL = 0.02
#: with --control, the bars are at least this times the control's own parting from stock
CONTROL_MARGIN = 1.5
#: logits of a loaded checkpoint against its source model (relative Frobenius norm)
LOGITS_RTOL = 0.02


# -- arguments ---------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="debugmodel")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"training steps per run (default 200; {SMOKE_STEPS} with --smoke)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=None,
                    help="sequences per step (default: debugmodel 8, experts 4)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda (cpu with --smoke)")
    ap.add_argument("--attn", choices=ATTN_BACKENDS, default="auto",
                    help="attention backend: auto is flex on cuda, sdpa (causal) on the cpu")
    ap.add_argument("--smoke", action="store_true",
                    help=f"{SMOKE_STEPS} steps on the CPU, batch {SMOKE_SHAPE[0]} x {SMOKE_SHAPE[1]} tokens; "
                         "checks the mechanics, not the agreement; writes only where --out/--plot say")
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/train-titan-<device>.json, replaced)")
    ap.add_argument("--plot", default=None, help="PNG path (default: docs/training.png)")
    ap.add_argument("--control", action="store_true",
                    help="also train the stock model from weights perturbed by a bf16 rounding's size "
                         f"(x (1 + 2^{CONTROL_LOG2} N(0, 1))): how far two correct runs part")
    args = ap.parse_args(argv)

    batch, seq_len = SMOKE_SHAPE if args.smoke else DEFAULT_SHAPE[args.config]
    args.batch = batch if args.batch is None else args.batch
    args.seq_len = seq_len if args.seq_len is None else args.seq_len
    args.steps = (SMOKE_STEPS if args.smoke else 200) if args.steps is None else args.steps
    args.device = ("cpu" if args.smoke else "cuda") if args.device is None else args.device
    for name in ("steps", "batch", "seq_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if args.smoke and args.device != "cpu":
        ap.error("--smoke runs on the CPU; leave out --device or pass --device cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU here (run with --device cpu or --smoke)")
    if args.attn == "auto":
        args.attn = "flex" if args.device == "cuda" and flex_usable() else "sdpa"
    if args.device == "cpu" and args.attn in ("flex", "varlen"):
        ap.error(f"--attn {args.attn}: needs CUDA (FlexAttention has no CPU backward; varlen is flash "
                 "attention); use --attn sdpa on the CPU")
    return args


def flex_usable() -> bool:
    """Whether TorchTitan's FlexAttention masks build with this torch (its block mask passes
    ``separate_full_blocks``, which torch 2.11's ``create_block_mask`` lacks)."""
    import inspect

    from torch.nn.attention.flex_attention import create_block_mask

    return "separate_full_blocks" in inspect.signature(create_block_mask).parameters


# -- the model -----------------------------------------------------------------------------------

def model_config(name: str, attn: str, *, smoke: bool = False):
    """TorchTitan's DeepSeek-V3 config for ``--config name`` with the ``attn`` backend (its first
    SMOKE_LAYERS layers with ``smoke``)."""
    _torch_2_11_shim()
    from torchtitan.models.deepseek_v3 import model_registry

    cfg = model_registry("debugmodel", attn_backend="flex").model
    if smoke:
        cfg.layers = cfg.layers[:SMOKE_LAYERS]
    if name == "experts":
        cfg = _with_large_experts(cfg)
    _set_attention(cfg, attn)
    return cfg


def _torch_2_11_shim() -> None:
    """TorchTitan 0.3's DeepSeek-V3 package imports ``torch.distributed.fsdp.DataParallelMeshDims``
    (torch 2.12+) for its multi-token-prediction decoder, which this run never builds; on an
    older torch (the lent GPU's 2.11) the name gets a placeholder so the package imports."""
    import torch.distributed.fsdp as fsdp

    if not hasattr(fsdp, "DataParallelMeshDims"):
        fsdp.DataParallelMeshDims = type("DataParallelMeshDims", (), {})


def _with_large_experts(cfg):
    """The debugmodel config with its layers rebuilt at EXPERTS_SHAPE (EXPERTS_HEADS attention
    heads) by TorchTitan's own builder, everything else (depth, the dense first layer, MLA's
    head dims, RoPE, router scoring, initializers) taken from the debugmodel config itself."""
    from torchtitan.models.deepseek_v3 import build_mla_moe_layers

    attn = cfg.layers[0].attention
    moe_layers = [layer for layer in cfg.layers if layer.moe is not None]
    dim = EXPERTS_SHAPE["dim"]
    layers = build_mla_moe_layers(
        n_layers=len(cfg.layers), n_dense_layers=len(cfg.layers) - len(moe_layers), dim=dim,
        n_heads=EXPERTS_HEADS, q_lora_rank=attn.q_lora_rank, kv_lora_rank=attn.kv_lora_rank,
        qk_nope_head_dim=attn.qk_nope_head_dim, qk_rope_head_dim=attn.qk_rope_head_dim,
        v_head_dim=attn.v_head_dim, mscale=attn.mscale, dense_hidden_dim=EXPERTS_DENSE_HIDDEN,
        moe_hidden_dim=EXPERTS_SHAPE["moe_hidden_dim"], num_experts=EXPERTS_SHAPE["num_experts"],
        num_shared_experts=1, router_top_k=EXPERTS_SHAPE["top_k"],
        router_score_func=moe_layers[0].moe.router.score_func, attn_backend="flex",
        moe_comm_backend="standard", non_blocking_capacity_factor=None,
        linear_init=attn.wkv_a.param_init, norm_init=cfg.norm.param_init,
        depth_init=lambda i: cfg.layers[i].attention.wo.param_init,
        depth_experts_init=lambda i: cfg.layers[i].moe.routed_experts.inner_experts.param_init,
        rope=attn.rope)
    for layer in layers:
        if layer.moe is not None:
            layer.moe.shared_experts = None  # Qwen3's MoE layers have none: routed experts only
    cfg.layers = layers
    cfg.dim = dim
    cfg.tok_embeddings.embedding_dim = dim
    cfg.norm.normalized_shape = dim
    cfg.lm_head.in_features = dim
    return cfg


def _set_attention(cfg, attn: str) -> None:
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import get_attention_config

    for layer in list(cfg.layers) + list(cfg.mtp_layers):
        layer.attention.inner_attention = (ScaledDotProductAttention.Config() if attn == "sdpa"
                                           else get_attention_config(attn))


def build_model(cfg, seed: int, device: torch.device, *, swapped: bool) -> nn.Module:
    """The model as TorchTitan's trainer builds it (meta, ``to_empty``, ``init_weights``),
    seeded, then swapped if asked."""
    with torch.device("meta"):
        model = cfg.build()
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    if swapped:
        from cudnn_ext.integrations.torchtitan import swap_experts

        model = swap_experts(model)
    return model


def perturb(model: nn.Module, seed: int) -> None:
    """Every floating parameter times ``1 + 2^CONTROL_LOG2 x N(0, 1)`` (a generator of its own):
    a change of the size of one bf16 rounding, which a correct run of other arithmetic makes
    too, so the control's parting from stock is what rounding alone does to this training."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device)
                p.mul_(1 + noise.to(p.dtype) * 2.0 ** CONTROL_LOG2)


def routed_expert_share(cfg, model: nn.Module, seq_len: int) -> dict:
    """The routed experts' share of a step's FLOPs by TorchTitan's own count (6 x active
    parameters per token plus attention)."""
    _, flops_per_token = cfg.get_nparams_and_flops(model, seq_len)
    moe = [layer.moe for layer in cfg.layers if layer.moe is not None]
    expert = sum(6 * m.router.top_k * 3 * m.routed_experts.inner_experts.dim
                 * m.routed_experts.inner_experts.hidden_dim for m in moe)
    return {"params": sum(p.numel() for p in model.parameters()), "flops_per_token": flops_per_token,
            "routed_expert_flop_share": round(expert / flops_per_token, 3)}


class Bf16Compute:
    """FSDP2's bf16 mixed precision on one rank, without a process group: the model keeps fp32
    parameters (the optimizer's); each forward runs on bf16 copies (``torch.func.functional_call``),
    and their bf16 gradients land in the fp32 parameters' ``.grad`` as fp32."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.master = [p for _, p in model.named_parameters()]
        self.compute = [p.detach().to(torch.bfloat16).requires_grad_(p.requires_grad) for p in self.master]

    def __call__(self, *args, **kwargs):
        with torch.no_grad():
            torch._foreach_copy_(self.compute, self.master)  # FSDP's all-gather in param_dtype
        return functional_call(self.model, dict(zip(self.names, self.compute)), args, kwargs)

    def grads_to_master(self) -> None:
        # FSDP's reduce-scatter in reduce_dtype: the bf16 gradient, cast to fp32
        for m, c in zip(self.master, self.compute):
            m.grad = None if c.grad is None else c.grad.float()
            c.grad = None


# -- data ----------------------------------------------------------------------------------------

def token_stream(seed: int, steps: int, batch: int, seq_len: int, vocab: int) -> Tensor:
    """(steps, batch, seq_len + 1) token ids from a seeded random sparse bigram chain."""
    g = torch.Generator().manual_seed(seed)
    k = len(BIGRAM_SUCCESSORS)
    successors = torch.randint(0, vocab, (vocab, k), generator=g)
    rows = steps * batch
    picks = torch.multinomial(torch.tensor(BIGRAM_SUCCESSORS), rows * seq_len, replacement=True,
                              generator=g).view(rows, seq_len)
    out = torch.empty(rows, seq_len + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (rows,), generator=g)
    for t in range(seq_len):
        out[:, t + 1] = successors[out[:, t], picks[:, t]]
    return out.view(steps, batch, seq_len + 1)


def forward_kwargs(model: nn.Module, attn: str, batch: int, seq_len: int, device) -> dict:
    """``positions`` (one document per row) and, for flex/varlen, the attention masks the
    trainer builds from them; the same for every batch here, so built once."""
    positions = torch.arange(seq_len, device=device).expand(batch, seq_len)
    kwargs = {"positions": positions}
    if attn in ("flex", "varlen"):
        kwargs["attention_masks"] = model.get_attention_masks(positions=positions)
    return kwargs


# -- training ------------------------------------------------------------------------------------

class _OneDevice:
    """What TorchTitan's MoE load-balancing hook asks of ``ParallelDims`` on one device: no
    mesh to reduce the expert counts over. (A real ParallelDims builds a device mesh, which
    needs a process group, to answer the same.)"""
    ep_enabled = False
    tp = 1

    def get_optional_mesh(self, *args, **kwargs):
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: nn.Module, cfg, recipe, tokens: Tensor, args, device: torch.device) -> dict:
    """``args.steps`` optimizer steps of ``recipe`` (TorchTitan's trainer config: optimizer, LR
    schedule, clipping); per-step losses, tokens/s after the warm-up steps, and the device's
    peak memory."""
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.optimizer import register_moe_load_balancing_hook
    from torchtitan.distributed import utils as dist_utils

    optimizer = recipe.optimizer.build(model_parts=[model])
    register_moe_load_balancing_hook(optimizer, [model], _OneDevice())
    scheduler = recipe.lr_scheduler.build(optimizers=optimizer, training_steps=args.steps)
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=cfg.vocab_size))
    compute = Bf16Compute(model)
    kwargs = forward_kwargs(model, args.attn, args.batch, args.seq_len, device)
    params = list(model.parameters())
    # every target is valid (no padding): the trainer's global_valid_tokens, kept on the device
    valid_tokens = torch.tensor(args.batch * args.seq_len, device=device)

    warmup = min(WARMUP_STEPS, args.steps // 2)
    losses, start = [], None
    for step in range(args.steps):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
        batch = tokens[step]
        inputs, labels = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        logits = compute(inputs, **kwargs)
        loss, _ = loss_fn(logits, labels, valid_tokens)
        del logits
        loss.backward()
        compute.grads_to_master()
        dist_utils.clip_grad_norm_(params, recipe.training.max_norm, foreach=True)
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
    _sync(device)
    seconds = time.perf_counter() - start
    timed_tokens = (args.steps - warmup) * args.batch * args.seq_len
    return {"loss": [float(x) for x in losses],
            "tokens_per_s": round(timed_tokens / seconds, 1),
            "timed_steps": args.steps - warmup,
            "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None}


@torch.no_grad()
def eval_logits(model: nn.Module, batch: Tensor, attn: str, device) -> Tensor:
    """fp32 logits of ``batch``'s inputs, computed as in training (bf16 copies of the weights),
    in eval mode (the MoE layers count no tokens)."""
    model.eval()
    inputs = batch[:, :-1].to(device)
    kwargs = forward_kwargs(model, attn, inputs.shape[0], inputs.shape[1], device)
    logits = Bf16Compute(model)(inputs, **kwargs).float().cpu()
    model.train()
    return logits


# -- comparison ----------------------------------------------------------------------------------

def compare_losses(stock: list, swapped: list, early_rtol: float = EARLY_RTOL,
                   final_rtol: float = FINAL_RTOL) -> dict:
    """Differences of the two curves and whether they agree (within ``early_rtol`` at each of
    the first EARLY_STEPS steps, ``final_rtol`` over the FINAL_WINDOW last)."""
    abs_diff = [abs(b - a) for a, b in zip(stock, swapped)]
    rel_diff = [d / abs(a) if a else math.inf for d, a in zip(abs_diff, stock)]
    window = min(FINAL_WINDOW, len(stock))
    stock_mean = sum(stock[-window:]) / window
    swapped_mean = sum(swapped[-window:]) / window
    final_window_rel = abs(swapped_mean - stock_mean) / abs(stock_mean)
    finite = all(math.isfinite(x) for x in stock + swapped)
    early = rel_diff[:EARLY_STEPS]
    return {"max_abs_loss_diff": max(abs_diff), "max_rel_loss_diff": max(rel_diff),
            "early_max_rel_loss_diff": max(early),
            "final_abs_loss_diff": abs_diff[-1], "final_rel_loss_diff": rel_diff[-1],
            "final_window_rel_loss_diff": final_window_rel,
            "agrees": finite and max(early) <= early_rtol and final_window_rel <= final_rtol}


def _rel_norm(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cross_load(checkpoint: Path, fixed: Tensor, source_logits: Tensor, cfg, args, device, *,
               into_swapped: bool) -> dict:
    """Load ``checkpoint`` strictly into a freshly built model of the other kind: its weights must
    be the saved ones exactly, and its logits on ``fixed`` within LOGITS_RTOL of the source
    model's."""
    saved = torch.load(checkpoint, map_location=device, weights_only=True)
    target = build_model(cfg, args.seed + 1, device, swapped=into_swapped)  # other weights until loaded
    target.load_state_dict(saved, strict=True)
    loaded = target.state_dict()
    mismatched = sorted(k for k in saved if k not in loaded or not torch.equal(loaded[k], saved[k]))
    rel = _rel_norm(eval_logits(target, fixed, args.attn, device), source_logits)
    del target, saved, loaded
    return {"weights_equal": not mismatched, "mismatched_keys": mismatched[:5],
            "logits_rel_diff": rel, "ok": not mismatched and rel <= LOGITS_RTOL}


def _fixed_batch(args, cfg) -> Tensor:
    # a batch the models never trained on, from the stream's generator with the next seed
    return token_stream(args.seed + 1, 1, args.batch, args.seq_len, cfg.vocab_size)[0]


def _snapshot(model: nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _check_same_start(model: nn.Module, stock_start: dict) -> None:
    now = model.state_dict()
    if now.keys() != stock_start.keys():
        raise RuntimeError(f"the swapped model's state_dict keys differ from the stock model's: "
                           f"{sorted(now.keys() ^ stock_start.keys())[:5]}")
    differ = [k for k, v in now.items() if not torch.equal(v.cpu(), stock_start[k])]
    if differ:
        raise RuntimeError(f"the swapped model does not start from the stock model's weights: {differ[:5]}")


# -- one run of each kind ------------------------------------------------------------------------

def training_recipe():
    """The optimizer, learning-rate schedule and gradient clipping of TorchTitan's debugmodel
    recipe (``deepseek_v3.config_registry.deepseek_v3_debugmodel``: AdamW at 8e-4, 2 warm-up
    steps, linear decay over the last 80%), built from TorchTitan's own config classes: the
    registry module imports the Hugging Face dataset loader (the ``datasets`` package), which a
    run on synthetic tokens does not need. tests/benchmarks/test_train_titan.py checks it
    against the registry's where ``datasets`` is installed."""
    from types import SimpleNamespace

    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.config import TrainingConfig

    return SimpleNamespace(
        optimizer=default_adamw(lr=8e-4),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear",
                                                  min_lr_factor=0.0),
        training=TrainingConfig(local_batch_size=8, seq_len=2048, steps=10))


def run_both(cfg, args, device: torch.device, workdir: Path) -> dict:
    """Stock then swapped, one model on the device at a time; returns the runs and the
    checkpoint round trip."""
    recipe = training_recipe()
    tokens = token_stream(args.seed, args.steps, args.batch, args.seq_len, cfg.vocab_size).to(device)
    fixed = _fixed_batch(args, cfg).to(device)
    runs, logits, summary, start = {}, {}, None, None
    for kind in ("stock", "swapped") + (("control",) if args.control else ()):
        _free(device)
        model = build_model(cfg, args.seed, device, swapped=kind == "swapped")
        if kind == "stock":
            start = _snapshot(model)
            summary = routed_expert_share(cfg, model, args.seq_len)
        elif kind == "swapped":
            _check_same_start(model, start)
            start = None
        else:
            perturb(model, args.seed + 1)
        print(f"{kind}: training {args.steps} steps", flush=True)
        runs[kind] = train(model, cfg, recipe, tokens, args, device)
        print(f"{kind}: loss {runs[kind]['loss'][0]:.4f} -> {runs[kind]['loss'][-1]:.4f}, "
              f"{runs[kind]['tokens_per_s']:.0f} tokens/s", flush=True)
        if kind != "control":
            torch.save(model.state_dict(), workdir / f"{kind}.pt")
            logits[kind] = eval_logits(model, fixed, args.attn, device)
        del model
    _free(device)
    trips = {"stock_to_swapped": cross_load(workdir / "stock.pt", fixed, logits["stock"], cfg, args, device,
                                            into_swapped=True),
             "swapped_to_stock": cross_load(workdir / "swapped.pt", fixed, logits["swapped"], cfg, args, device,
                                            into_swapped=False)}
    return {"runs": runs, "checkpoint": trips, "model": summary}


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# -- output --------------------------------------------------------------------------------------

def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def default_out(name: str) -> Path:
    return ROOT / "benchmarks" / "results" / f"train-titan-{name.replace(' ', '_')}.json"


def plot(doc: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot ({path})", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    # the curves lie on each other: the stock one wide underneath, the swapped one dashed on top
    curves = [(doc["stock"]["loss"], "TorchTitan GroupedExperts", dict(linewidth=2.4, alpha=0.6)),
              (doc["swapped"]["loss"], "cudnn_ext (swap_experts)", dict(linewidth=1.0, linestyle="--"))]
    if "control" in doc:
        curves.append((doc["control"]["run"]["loss"], "TorchTitan, perturbed start (control)",
                       dict(linewidth=1.0, linestyle=":")))
    for loss, label, style in curves:
        ax.plot(range(1, len(loss) + 1), loss, label=label, **style)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"TorchTitan DeepSeek-V3 {doc['config']}, {doc['device']}: "
                 f"max rel. diff {doc['max_rel_loss_diff']:.2%}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    # TorchTitan's router asks for a float32 autocast, which the CPU does not have (harmless)
    warnings.filterwarnings("ignore", message="In CPU autocast")
    device = torch.device(args.device)
    cfg = model_config(args.config, args.attn, smoke=args.smoke)
    if args.seq_len > cfg.max_seq_len:  # what TorchTitan's update_from_config refuses
        raise ValueError(f"--seq-len: at most the model's RoPE length {cfg.max_seq_len}, got {args.seq_len}")
    with tempfile.TemporaryDirectory(prefix="train_titan_") as workdir:
        result = run_both(cfg, args, device, Path(workdir))

    stock, swapped = result["runs"]["stock"], result["runs"]["swapped"]
    control = None
    tol = {"early_rel": EARLY_RTOL, "final_window_rel": FINAL_RTOL}
    if args.control:  # the same measures between stock and its perturbed twin
        control = {"run": result["runs"]["control"], "perturbation_log2": CONTROL_LOG2,
                   **{k: v for k, v in compare_losses(stock["loss"], result["runs"]["control"]["loss"]).items()
                      if k != "agrees"}}
        # the bars widen to what rounding alone does to this run, with a margin
        tol = {"early_rel": max(EARLY_RTOL, CONTROL_MARGIN * control["early_max_rel_loss_diff"]),
               "final_window_rel": max(FINAL_RTOL, CONTROL_MARGIN * control["final_window_rel_loss_diff"])}
    agreement = compare_losses(stock["loss"], swapped["loss"], tol["early_rel"], tol["final_window_rel"])
    round_trip = all(t["ok"] for t in result["checkpoint"].values())
    name = device_name(device)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    doc = {"command": " ".join(["python3", "benchmarks/train_titan.py"] + argv_list),
           "device": name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "config": args.config, "steps": args.steps, "seed": args.seed, "batch": args.batch,
           "seq_len": args.seq_len, "attn": args.attn, "smoke": args.smoke, "model": result["model"],
           "stock": stock, "swapped": swapped, **agreement,
           "tolerance": {"early_steps": EARLY_STEPS, "final_window": FINAL_WINDOW, **tol,
                         "control_margin": CONTROL_MARGIN if control is not None else None,
                         "checkpoint_logits_rel": LOGITS_RTOL},
           "checkpoint_round_trip": round_trip, "checkpoint": result["checkpoint"]}
    if control is not None:
        doc["control"] = control

    out = Path(args.out) if args.out else (None if args.smoke else default_out(name))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"results: {out}", flush=True)
    plot_path = Path(args.plot) if args.plot else (None if args.smoke else ROOT / "docs" / "training.png")
    if plot_path is not None:
        plot(doc, plot_path)

    print(f"early max rel. loss diff {agreement['early_max_rel_loss_diff']:.3%} (bar {tol['early_rel']:.3%}), "
          f"max rel. loss diff {agreement['max_rel_loss_diff']:.3%}, final-window rel. diff "
          f"{agreement['final_window_rel_loss_diff']:.3%} (bar {tol['final_window_rel']:.3%}): {'agree' if agreement['agrees'] else 'DO NOT AGREE'}; "
          f"checkpoint round trip {'ok' if round_trip else 'FAILED'}", flush=True)
    if control is not None:
        early = control["early_max_rel_loss_diff"]
        print(f"control (stock from perturbed weights): early max rel. diff {early:.3%}, max rel. diff "
              f"{control['max_rel_loss_diff']:.3%}, final-window rel. diff {control['final_window_rel_loss_diff']:.3%}",
              flush=True)
    if not round_trip:
        return 1
    return 0 if agreement["agrees"] or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
