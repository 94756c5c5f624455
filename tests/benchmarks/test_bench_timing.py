"""The benchmark's round-robin timing (benchmarks/bench_dglu.py), on the CPU with fake timers.

Performance itself is measured by the benchmarks, never here: these tests only check how
the benchmark schedules its timed calls, which decides whether side-by-side rows compare
fairly (on the H200 a row timed after the others read up to 12% slower than the same
kernel timed first)."""

import pytest

import bench_dglu


def test_round_robin_order_rotates_by_one_per_round():
    assert bench_dglu.round_robin_order(["a", "b", "c"], 4) == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert bench_dglu.round_robin_order([], 3) == []


class _Clock:
    """A fake timer whose readings drift upward with every call, like clocks that drop under
    sustained load, and a log of which entry each timed call ran."""

    def __init__(self, drift):
        self.calls, self.drift = [], drift

    def __call__(self, fn):
        fn()
        self.calls.append(fn.name)
        return 1.0 + self.drift * len(self.calls)


def _fns(names, log):
    def make(n):
        def fn():
            log.append(n)
        fn.name = n
        return fn
    return {n: make(n) for n in names}


def test_every_entry_gets_its_warmup_and_timed_calls():
    log = []
    clock = _Clock(drift=0.0)
    medians, errors = bench_dglu.bench_round_robin(_fns("abc", log), warmup=2, reps=7, rounds=3,
                                                   timer=clock, sync=lambda: None)
    assert errors == {}
    assert medians == {"a": 1.0, "b": 1.0, "c": 1.0}
    # warm-up first (2 each, in order), then ceil(7 / 3) = 3 timed calls per entry per round
    assert log[:6] == ["a", "a", "b", "b", "c", "c"]
    assert [clock.calls.count(n) for n in "abc"] == [9, 9, 9]
    firsts = [clock.calls[i] for i in range(0, 27, 9)]
    assert firsts == ["a", "b", "c"]  # each round starts one entry later


def test_rotation_spreads_a_drift_that_sequential_timing_pins_on_the_last_rows():
    def spread(rounds):
        medians, _ = bench_dglu.bench_round_robin(_fns("abcd", []), warmup=0, reps=20,
                                                  rounds=rounds, timer=_Clock(drift=0.01),
                                                  sync=lambda: None)
        return max(medians.values()) - min(medians.values())
    assert spread(1) == pytest.approx(0.6)  # d timed 60 calls after a
    assert spread(5) < spread(1) / 3


def test_an_entry_that_raises_is_reported_and_the_others_still_timed():
    log = []
    fns = _fns("ab", log)

    def broken():
        raise RuntimeError("no kernel for this device")
    broken.name = "x"
    fns["x"] = broken
    medians, errors = bench_dglu.bench_round_robin(fns, warmup=1, reps=4, rounds=2,
                                                   timer=_Clock(drift=0.0), sync=lambda: None)
    assert set(medians) == {"a", "b"}
    assert errors == {"x": "RuntimeError: no kernel for this device"}


@pytest.mark.parametrize("dbias", [True, False])
def test_op_row_calls_the_torch_op_with_out(dbias):
    """The ``cudnn_ext_op`` row runs ``cudnn_ext.torch.grouped_gemm_dglu(..., out=...)`` on the
    benchmark's pack (here on the CPU, where the op runs the reference engine): it writes the
    pack's D and accumulates dprob (and dbias) the way the plan rows do."""
    import torch

    from cudnn_ext.problem import ActConfig, DgluProblem
    from cudnn_ext.reference import reference_outputs

    torch.manual_seed(0)
    pack = bench_dglu.make_inputs([256, 0, 256], 64, 64, dev="cpu")
    if not dbias:
        pack["dbias"] = None
    pack["d_row"].fill_(float("nan"))
    problem = DgluProblem(n=64, k=64, num_experts=3, m=512, weight_mode="dense", b_major="k",
                          ab_dtype=torch.bfloat16,
                          c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                          act=ActConfig("dswiglu"), generate_dbias=dbias, device_type="cpu")
    ref = reference_outputs(problem, pack, compute_dtype=torch.float64,
                            dprob_init=pack["dprob"].clone())
    fn, extra = bench_dglu.run_cudnn_ext_op(pack, dbias=dbias)
    assert extra == {}
    fn()
    torch.testing.assert_close(pack["d_row"].double(), ref["d_row"].double(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pack["dprob"].double(), ref["dprob"].double(), rtol=1e-3, atol=1e-3)
    if dbias:  # (the pack's dbias starts at zero, like the reference's)
        torch.testing.assert_close(pack["dbias"].double(), ref["dbias"].double(), rtol=2e-2,
                                   atol=2e-2)


class _FakeCuda:
    """Stands in for torch.cuda on the CPU: a stream whose clock advances by the spin's cycles
    (1000 per microsecond) and by each call's device time; events read that clock when the
    stream reaches them. The host issue time of a call is simulated by advancing a host clock;
    a call issued after the spin has ended starts late, and its span holds the difference."""

    def __init__(self):
        self.gpu_us = 0.0    # when the stream is next free
        self.host_us = 0.0   # host time
        self.spins = []

    def _sleep(self, cycles):
        self.spins.append(cycles)
        self.gpu_us = max(self.gpu_us, self.host_us) + cycles / 1000.0

    def launch(self, device_us, issue_us):
        self.host_us += issue_us
        self.gpu_us = max(self.gpu_us, self.host_us) + device_us

    def synchronize(self):
        self.host_us = max(self.host_us, self.gpu_us)

    def Event(self, enable_timing=True):
        fake = self

        class _Ev:
            def record(self):
                self.t = max(fake.gpu_us, fake.host_us)
                fake.gpu_us = self.t

            def elapsed_time(self, other):
                return (other.t - self.t) / 1000.0
        return _Ev()


@pytest.mark.parametrize("issue_us,late", [(20.0, 0), (500.0, 1)])
# (the benchmark's default spin is 1000 us: quack's calls take up to 550 us to issue on the
# H200's host)
def test_device_timer_hides_the_launch_and_counts_late_calls(monkeypatch, issue_us, late):
    """The gpu timer reads a call's device time (80 us here) whatever its host issue time, as
    long as the spin outlasts the issue; a call issued after the spin ends is counted late
    (and its span holds the part of the issue latency the spin did not cover)."""
    fake = _FakeCuda()
    monkeypatch.setattr(bench_dglu.torch, "cuda", fake)
    clock = iter([0.0, issue_us * 1e-6] * 2)
    monkeypatch.setattr(bench_dglu.time, "perf_counter", lambda: next(clock))
    timer = bench_dglu.DeviceTimer(busy_us=300.0)
    ms = timer(lambda: fake.launch(device_us=80.0, issue_us=issue_us))
    assert fake.spins[-1] == 300_000  # calibrated to 300 us of spin at 1000 cycles/us
    assert timer.late == late
    assert timer.max_issue_us == pytest.approx(issue_us)
    if late:
        assert ms > 0.08  # part of the launch shows
    else:
        assert ms == pytest.approx(0.08)
    # the launch timer, on the same fake, always holds the issue latency
    fake.synchronize()
    assert bench_dglu.time_once(lambda: fake.launch(80.0, issue_us)) == pytest.approx(
        (80.0 + issue_us) / 1000.0)


def test_round_robin_takes_a_timer_per_entry():
    calls = []

    def timer_for(tag):
        def t(fn):
            fn()
            calls.append(tag)
            return {"a": 1.0, "b": 2.0}[tag]
        return t
    medians, errors = bench_dglu.bench_round_robin(_fns("ab", []), warmup=0, reps=4, rounds=2,
                                                   timer={"a": timer_for("a"), "b": timer_for("b")},
                                                   sync=lambda: None)
    assert errors == {} and medians == {"a": 1.0, "b": 2.0}
    assert calls.count("a") == 4 and calls.count("b") == 4


def test_act_rows_take_a_variant(monkeypatch):
    """``cudnn_ext_act:<act>[+feature][:<variant>]``: the variant's knobs reach the plan, the
    activation and the feature theirs; without a variant the engine chooses."""
    seen = []
    monkeypatch.setattr(bench_dglu, "run_cudnn_ext",
                        lambda pack, K, N, knobs=None, **kw: seen.append((knobs, kw)) or (None, {}))
    row = {}
    bench_dglu.build_impl("cudnn_ext_act:dgeglu+deterministic:t256c4m2s3k", {}, 256, 64, True, None, row)
    knobs, kw = seen[-1]
    assert knobs == bench_dglu.variant_knobs("t256c4m2s3k") and knobs.as_dict()["cooperative"]
    assert kw == dict(dbias=True, act="dgeglu", deterministic=True)
    assert row == dict(impl="cudnn_ext", variant="dgeglu+deterministic:t256c4m2s3k")
    bench_dglu.build_impl("cudnn_ext_act:dswiglu", {}, 256, 64, False, None, row)
    assert seen[-1] == (None, dict(dbias=False, act="dswiglu", deterministic=False))
    with pytest.raises(SystemExit, match="expected cudnn_ext_act"):
        bench_dglu.build_impl("cudnn_ext_act:dswiglu+fast", {}, 256, 64, True, None, row)
