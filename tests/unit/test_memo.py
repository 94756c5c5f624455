"""The wrapper's hot path: a repeated call with the same operand metadata skips re-validation,
but never skips what metadata cannot tell (pointer alignment) nor a differently-typed scalar."""
import pytest
import torch

import cudnn_ext
from cudnn_ext import contract
from cudnn_ext.runtime import memo as hot_path

L, N, K, M = 2, 32, 64, 512


def _kw(a=None):
    a = torch.randn(M, K).bfloat16() if a is None else a
    return dict(a_tensor=a, c_tensor=torch.randn(M, 2 * N).bfloat16(), sfa_tensor=None,
                padded_offsets=torch.tensor([256, 512], dtype=torch.int32), alpha_tensor=torch.ones(L),
                beta_tensor=torch.ones(L), prob_tensor=torch.rand(M), dprob_tensor=torch.zeros(M),
                b_tensor=torch.randn(L, N, K).bfloat16().permute(1, 2, 0), generate_dbias=True)


def test_repeat_call_skips_validation_and_matches(monkeypatch):
    hot_path.clear()
    kw = _kw()
    first = cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    d1, db1 = first["d_row_tensor"].clone(), first["dbias_tensor"].clone()

    def boom(*a, **k):
        raise AssertionError("contract.normalize ran for a remembered call")

    monkeypatch.setattr(contract, "normalize", boom)
    kw["dprob_tensor"].zero_()
    again = cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    assert torch.equal(again["d_row_tensor"][:512], d1[:512]) and torch.equal(again["dbias_tensor"], db1)
    assert again["dprob_tensor"] is kw["dprob_tensor"]


def test_repeat_call_still_checks_alignment():
    hot_path.clear()
    cudnn_ext.grouped_gemm_dglu_wrapper(**_kw())
    raw = torch.randn(M * K + 8).bfloat16()
    a = raw[1:1 + M * K].view(M, K)  # same shape and strides, 2-byte offset pointer
    with pytest.raises(ValueError, match="a_tensor.*16-byte aligned"):
        cudnn_ext.grouped_gemm_dglu_wrapper(**_kw(a))


def test_scalar_types_are_part_of_the_key():
    hot_path.clear()
    cudnn_ext.grouped_gemm_dglu_wrapper(**_kw())
    kw = _kw()
    kw["generate_dbias"] = 1  # == True, but not a bool
    with pytest.raises(TypeError, match="generate_dbias"):
        cudnn_ext.grouped_gemm_dglu_wrapper(**kw)


def test_new_token_count_misses_then_hits(monkeypatch):
    hot_path.clear()
    cudnn_ext.grouped_gemm_dglu_wrapper(**_kw())
    calls = []
    real = contract.normalize
    monkeypatch.setattr(contract, "normalize", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = _kw()
    kw["a_tensor"] = torch.randn(2 * M, K).bfloat16()
    kw["c_tensor"] = torch.randn(2 * M, 2 * N).bfloat16()
    kw["prob_tensor"], kw["dprob_tensor"] = torch.rand(2 * M), torch.zeros(2 * M)
    cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    assert len(calls) == 1  # validated once for the new M, remembered after


def test_class_execute_validates_each_metadata_once(monkeypatch):
    kw = _kw()
    d_row = torch.empty(M, 2 * N, dtype=torch.bfloat16)
    dbias = torch.zeros(L, 2 * N, dtype=torch.bfloat16)
    op = cudnn_ext.GroupedGemmDglu(
        sample_a=kw["a_tensor"], sample_c=kw["c_tensor"], sample_d_row=d_row, sample_d_col=None, sample_sfa=None,
        sample_padded_offsets=kw["padded_offsets"], sample_alpha=kw["alpha_tensor"], sample_beta=kw["beta_tensor"],
        sample_prob=kw["prob_tensor"], sample_dprob=kw["dprob_tensor"], sample_dbias=dbias, sample_b=kw["b_tensor"])
    run = dict(a_tensor=kw["a_tensor"], c_tensor=kw["c_tensor"], d_row_tensor=d_row, d_col_tensor=None,
               sfa_tensor=None, padded_offsets=kw["padded_offsets"], alpha_tensor=kw["alpha_tensor"],
               beta_tensor=kw["beta_tensor"], prob_tensor=kw["prob_tensor"], dprob_tensor=kw["dprob_tensor"],
               dbias_tensor=dbias, b_tensor=kw["b_tensor"])
    op.execute(**run)
    first = (d_row.clone(), kw["dprob_tensor"].clone(), dbias.clone())
    calls = []
    real = contract.normalize
    monkeypatch.setattr(contract, "normalize", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw["dprob_tensor"].zero_()
    dbias.zero_()
    op.execute(**run)
    assert calls == []
    assert torch.equal(d_row, first[0]) and torch.equal(kw["dprob_tensor"], first[1]) and torch.equal(dbias, first[2])
    # a different K is still caught: a new key validates, and the mismatch is reported
    bad = dict(run, a_tensor=torch.randn(M, 2 * K).bfloat16())
    with pytest.raises(ValueError):
        op.execute(**bad)
    assert calls == [1]


def test_class_execute_replays_its_last_call_by_guard(monkeypatch):
    """An object's execute whose tensors match its last validated call's metadata (one C++
    guard check) builds no key and runs no validation; a changed stride, a misaligned pointer
    or a cleared memo take the checked path."""
    from cudnn_ext.runtime import guards

    if not guards.AVAILABLE:
        pytest.skip("this torch build offers no tensor guards")
    hot_path.clear()
    kw = _kw()
    d_row = torch.empty(M, 2 * N, dtype=torch.bfloat16)
    op = cudnn_ext.GroupedGemmDglu(
        sample_a=kw["a_tensor"], sample_c=kw["c_tensor"], sample_d_row=d_row, sample_d_col=None, sample_sfa=None,
        sample_padded_offsets=kw["padded_offsets"], sample_alpha=kw["alpha_tensor"], sample_beta=kw["beta_tensor"],
        sample_prob=kw["prob_tensor"], sample_dprob=kw["dprob_tensor"], sample_b=kw["b_tensor"])
    run = dict(a_tensor=kw["a_tensor"], c_tensor=kw["c_tensor"], d_row_tensor=d_row, d_col_tensor=None,
               sfa_tensor=None, padded_offsets=kw["padded_offsets"], alpha_tensor=kw["alpha_tensor"],
               beta_tensor=kw["beta_tensor"], prob_tensor=kw["prob_tensor"], dprob_tensor=kw["dprob_tensor"],
               b_tensor=kw["b_tensor"])
    op.execute(**run)
    first = (d_row.clone(), kw["dprob_tensor"].clone())
    keys = []
    real_key = hot_path.call_key
    monkeypatch.setattr(hot_path, "call_key", lambda *a: keys.append(1) or real_key(*a))
    kw["dprob_tensor"].zero_()
    op.execute(**dict(run, a_tensor=kw["a_tensor"].clone()))  # new tensors, the same metadata
    assert keys == [] and torch.equal(d_row, first[0]) and torch.equal(kw["dprob_tensor"], first[1])
    # the same shape with other strides (M-major A): the keyed path, which refuses it
    with pytest.raises(ValueError):
        op.execute(**dict(run, a_tensor=torch.randn(K, M).bfloat16().t()))
    assert keys == [1]
    # a misaligned pointer with matching metadata: the replay's rebuild re-checks alignment
    op.execute(**run)
    raw = torch.randn(M * K + 8).bfloat16()
    with pytest.raises(ValueError, match="a_tensor.*16-byte aligned"):
        op.execute(**dict(run, a_tensor=raw[1:1 + M * K].view(M, K)))
    # a cleared memo forgets the guard too
    op.execute(**run)
    hot_path.clear()
    n = len(keys)
    op.execute(**run)
    assert len(keys) == n + 1


@pytest.mark.parametrize("bad", [0, 8])
def test_bad_pointer_table_fails_before_any_output_is_written(bad):
    ws = [torch.randn(N, K).bfloat16() for _ in range(L)]
    ptrs = torch.tensor([ws[0].data_ptr(), bad if bad == 0 else ws[1].data_ptr() + bad], dtype=torch.int64)
    kw = _kw()
    del kw["b_tensor"]
    dprob = kw["dprob_tensor"]
    with pytest.raises(ValueError, match=r"b_ptrs\[1\]"):
        cudnn_ext.grouped_gemm_dglu_wrapper(**kw, b_ptrs=ptrs, n=N, b_dtype=torch.bfloat16)
    assert dprob.eq(0).all()  # expert 0's contribution was not added before the failure


def test_call_config_hash_is_cached_and_consistent_with_equality():
    """The torch op's memo key holds a CallConfig: its hash is computed once per instance and
    stays consistent with the field-wise equality (replace, copy and pickle included)."""
    import copy
    import dataclasses
    import pickle

    cfg = contract.CallConfig(act_func="dgeglu", geglu_alpha=1.5)
    same = contract.CallConfig(act_func="dgeglu", geglu_alpha=1.5)
    other = dataclasses.replace(cfg, geglu_alpha=1.0)
    assert cfg == same and hash(cfg) == hash(same) and {cfg: 1}[same] == 1
    assert cfg != other and other not in {cfg: 1}
    assert cfg.__dict__["_hash"] == hash(cfg)  # cached after the first hash
    for twin in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert twin == cfg and hash(twin) == hash(cfg)
    # str hashes are salted per process: a pickled config must not carry its cached hash
    assert "_hash" not in cfg.__getstate__() and "_hash" in cfg.__dict__
    assert "_hash" not in dataclasses.asdict(cfg) and "_hash" not in repr(cfg)


def test_launch_stream_off_gpu_is_none():
    """CPU tensors have no stream: the wrapper/class API enter no stream context for them."""
    from cudnn_ext.runtime.streams import launch_stream, stream_key

    cpu = torch.device("cpu")
    assert launch_stream(None, cpu) is None
    assert stream_key(None, cpu) is None


def _mxfp8_kw(flat_sf: bool):
    from cudnn_ext.quant import quantize_mxfp8, storage_of

    a_q, sfa = quantize_mxfp8(torch.randn(M, K))
    b_q, sfb = quantize_mxfp8(torch.randn(N, K, L))
    if flat_sf:  # the packed buffers as plain contiguous tensors, which the contract re-describes in 6-D
        sfa, sfb = storage_of(sfa).reshape(-1).clone(), storage_of(sfb).reshape(-1).clone()
    return dict(a_tensor=a_q, c_tensor=torch.randn(M, 2 * N).bfloat16(), sfa_tensor=sfa,
                padded_offsets=torch.tensor([256, 512], dtype=torch.int32), alpha_tensor=torch.ones(L),
                beta_tensor=torch.ones(L), prob_tensor=torch.rand(M), dprob_tensor=torch.zeros(M), b_tensor=b_q,
                sfb_tensor=sfb, norm_const_tensor=torch.ones(1), sf_vec_size=32, generate_dbias=False)


@pytest.mark.parametrize("flat_sf", [False, True], ids=["sf_6d", "sf_flat"])
def test_block_scaled_repeat_call_skips_validation_and_matches(monkeypatch, flat_sf):
    """Block-scaled calls are memoized too (their scale factors are views of the arguments'
    bytes in the contract's 6-D layout): a repeat validates nothing and computes the same."""
    hot_path.clear()
    kw = _mxfp8_kw(flat_sf)
    first = cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    d1, dp1 = first["d_row_tensor"].clone(), kw["dprob_tensor"].clone()
    monkeypatch.setattr(contract, "normalize", lambda *a, **k: (_ for _ in ()).throw(AssertionError("validated")))
    kw["dprob_tensor"].zero_()
    again = cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    assert torch.equal(again["d_row_tensor"].view(torch.uint8), d1.view(torch.uint8))
    assert torch.equal(kw["dprob_tensor"], dp1)
    other = _mxfp8_kw(flat_sf)  # new data, the same metadata: still no validation, its own result
    monkeypatch.undo()
    ref = cudnn_ext.grouped_gemm_dglu_wrapper(**dict(other, dprob_tensor=torch.zeros(M)))
    hot_path.clear()
    fresh = cudnn_ext.grouped_gemm_dglu_wrapper(**dict(other, dprob_tensor=torch.zeros(M)))
    assert torch.equal(ref["d_row_tensor"].view(torch.uint8), fresh["d_row_tensor"].view(torch.uint8))


def test_a_memo_hit_checks_the_alignment_the_contract_checks():
    """A hit re-checks each pointer's alignment exactly as the contract does for the slot: a
    block-scaled prob at a 4-byte offset passes both times (the contract leaves it unchecked),
    a BF16 activation output 16- but not 32-byte aligned fails the hit as it fails validation."""
    hot_path.clear()
    for _ in range(2):
        kw = _mxfp8_kw(False)
        kw["prob_tensor"] = torch.rand(M + 1)[1:]
        cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    hot_path.clear()
    raw = torch.empty(M * N + 32, dtype=torch.bfloat16)
    base = (-raw.data_ptr() % 32) // 2  # elements to the first 32-byte aligned address
    act = lambda off: raw[base + off:base + off + M * N].view(M, N)  # noqa: E731
    kw = dict(_kw(), act_func="dgeglu", activation_tensor=act(0))
    cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    with pytest.raises(ValueError, match="activation_tensor: .*32-byte aligned"):
        cudnn_ext.grouped_gemm_dglu_wrapper(**dict(kw, activation_tensor=act(8)))  # 16 bytes past
