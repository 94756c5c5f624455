"""benchmarks/roofline.py's byte and FLOP counts on a case small enough to count by hand."""
import json

import pytest

import roofline


def test_counts_each_tensor_once_and_skips_weights_of_empty_experts():
    t = roofline.traffic([256, 0, 512], K=64, N=32)
    M = 768
    assert t["flops"] == 2 * M * 32 * 64
    assert t["gemm"] == {"a": M * 64 * 2, "b": 2 * 32 * 64 * 2, "out": M * 32 * 2}
    assert t["fused"] == {"a": M * 64 * 2, "b": 2 * 32 * 64 * 2, "c": M * 64 * 2,
                          "d": M * 64 * 2, "prob_dprob": M * 8, "dbias": 2 * 64 * 2}
    assert t["fused_bytes"] == sum(t["fused"].values())
    fp32 = roofline.traffic([256], K=64, N=32, c_bytes=4, d_bytes=4, dbias=False)
    assert fp32["fused"]["c"] == fp32["fused"]["d"] == 256 * 64 * 4 and fp32["fused"]["dbias"] == 0


def test_floors_and_measured_rows(tmp_path):
    t = {"fused_bytes": 4.8e9, "gemm_bytes": 2.4e9, "flops": 989e9}
    f = roofline.floors_us(t, bw=4.8e12, flops=989e12)
    assert f == {"fused_mem_us": pytest.approx(1000.0), "gemm_mem_us": pytest.approx(500.0),
                 "compute_us": pytest.approx(1000.0)}
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"rows": [
        {"shape": "qwen3", "impl": "cudnn_ext", "ms": 0.133},
        {"shape": "qwen3", "impl": "cudnn_ext", "variant": "discrete", "ms": 0.2},
        {"shape": "qwen3", "impl": "quack", "error": "x"}]}))
    assert roofline.measured(str(p)) == {("qwen3", "cudnn_ext"): 0.133}
