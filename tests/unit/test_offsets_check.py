"""The device-side check of padded_offsets' values (contract.check_offsets_on_device): the
rules it enforces, and when the entry points run it (the first call of a call signature of
the wrapper and the torch op, every call under CUDNN_EXT_CHECK_OFFSETS=1). On the CPU
torch._assert_async raises at once, so the predicate is tested here; the GPU runs the same
kernels."""
import pytest
import torch

from cudnn_ext import contract


@pytest.mark.parametrize("offsets,m,aligned,ok", [
    ([256, 512], 512, 256, True),
    ([0, 0, 8], 8, 8, True),
    ([3, 3, 10], 10, 1, True),
    ([256, 128], 512, 256, False),  # decreasing
    ([256, 768], 512, 256, False),  # past M
    ([8, 12], 16, 8, False),  # not a multiple of m_aligned
    ([-8, 8], 16, 8, False),  # negative
    ([512], 512, 256, True),
])
def test_offsets_rules(offsets, m, aligned, ok):
    t = torch.tensor(offsets, dtype=torch.int32)
    if ok:
        contract.check_offsets_on_device(t, m, aligned)
    else:
        with pytest.raises(RuntimeError, match="padded_offsets: must be non-negative, non-decreasing"):
            contract.check_offsets_on_device(t, m, aligned)


class _Problem:
    block_scale = None
    m_aligned = 256


def test_entry_points_check_on_the_first_call_or_under_the_flag(monkeypatch):
    """check_call_offsets runs the check for CUDA offsets on a first call, or on every call
    under the flag (a meta tensor stands in for CUDA: its device type is swapped in)."""
    seen = []
    monkeypatch.setattr(contract.rules, "check_offsets_on_device", lambda o, m, a: seen.append((m, a)))

    class Cuda:
        device = torch.device("cuda", 0)

        def numel(self):
            return 2

    pack = {"padded_offsets": Cuda(), "c": torch.empty(512, 64)}
    monkeypatch.setattr(contract.rules, "_EVERY_CALL", False)
    contract.check_call_offsets(_Problem(), pack, first=False)
    assert seen == []
    contract.check_call_offsets(_Problem(), pack, first=True)
    assert seen == [(512, 256)]
    monkeypatch.setattr(contract.rules, "_EVERY_CALL", True)  # CUDNN_EXT_CHECK_OFFSETS=1 at import
    contract.check_call_offsets(_Problem(), pack, first=False)
    assert len(seen) == 2
    cpu = {"padded_offsets": torch.tensor([256, 512]), "c": pack["c"]}
    contract.check_call_offsets(_Problem(), cpu, first=True)  # the CPU engine checks values itself
    assert len(seen) == 2


def test_the_flag_is_read_at_import():
    import os
    import subprocess
    import sys

    code = "from cudnn_ext import contract; print(contract.offsets_checked_every_call())"
    for value, want in (("1", "True"), ("0", "False"), ("", "False")):
        env = dict(os.environ, **{contract.CHECK_OFFSETS_ENV: value})
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.stdout.strip() == want, (value, r.stdout, r.stderr)


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4"])
@pytest.mark.parametrize("memoized", [True, False])
def test_the_wrapper_checks_once_per_call_signature(monkeypatch, fmt, memoized):
    """The wrapper's device check runs on the first call of a signature only, for calls that
    are memoized (BF16 and block-scaled alike) and for calls validated every time (``views_of``
    None): it costs a few launches, as much as a small call's host time."""
    from exact_cases import exact_case, run_wrapper

    from cudnn_ext.api import call_memo
    from cudnn_ext.runtime import memo

    firsts = []
    monkeypatch.setattr(contract, "check_call_offsets", lambda problem, pack, first: firsts.append(first))
    if not memoized:
        monkeypatch.setattr(call_memo, "views_of", lambda ops, problem, pack: None)
    memo.clear()
    t = exact_case("dswiglu", fmt=fmt)
    for _ in range(3):
        run_wrapper(t)
    assert firsts[0] is True and not any(firsts[1:]), firsts
    assert len(firsts) == (1 if memoized else 3)  # a memoized repeat returns before the check
    run_wrapper(exact_case("dswiglu", fmt=fmt, sizes=(256, 256, 256)))  # the same signature: M is equal
    assert firsts.count(True) == 1
