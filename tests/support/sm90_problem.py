"""The DgluProblem the SM90 compile-tier tests build (BF16 operands on CUDA; tests only)."""
import torch

from cudnn_ext.problem import ActConfig, DgluProblem

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
_DT = {BF16: "bf16", FP16: "fp16", FP32: "fp32"}


def problem(act="dswiglu", c=BF16, d=BF16, dbias=True, n=96, k=200, m=1024, L=4,
             weight_mode="dense", b_major="k", activation=False, round_dgrad=False,
             m_aligned=256):
    return DgluProblem(n=n, k=k, num_experts=L, m=m, weight_mode=weight_mode, b_major=b_major,
                       ab_dtype=BF16, c_dtype=c, d_dtype=d, act=ActConfig(act_func=act),
                       generate_dbias=dbias, device_type="cuda", generate_activation=activation,
                       round_dgrad_to_input_dtype=round_dgrad, m_aligned=m_aligned)
