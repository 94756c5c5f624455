"""benchmarks/train_titan.py's --smoke run: TorchTitan's DeepSeek-V3 debug model trains a few
steps on the CPU stock and swapped, both checkpoints load into the other kind of model, and
the result file has the documented form. Times and the curves' agreement on the CPU mean
nothing and are not checked."""
import json
import math

import pytest

pytest.importorskip("torchtitan", reason="needs torchtitan (pip install '.[titan]')")

import train_titan  # noqa: E402

train_titan._torch_2_11_shim()  # before TorchTitan's DeepSeek-V3 package imports (torch < 2.12)
pytest.importorskip("torchtitan.models.deepseek_v3", reason="needs torchtitan's DeepSeek-V3 package")


@pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")
def test_smoke_run_trains_both_and_round_trips_checkpoints(tmp_path):
    out, png = tmp_path / "x.json", tmp_path / "x.png"
    assert train_titan.main(["--smoke", "--steps", "3", "--out", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    for key in ("command", "device", "date", "torch", "config", "steps", "seed", "stock", "swapped",
                "max_rel_loss_diff", "agrees", "tolerance", "checkpoint_round_trip"):
        assert key in doc, key
    assert doc["device"] == "cpu" and doc["config"] == "debugmodel" and doc["steps"] == 3
    assert "train_titan.py --smoke" in doc["command"]
    for kind in ("stock", "swapped"):
        run = doc[kind]
        assert len(run["loss"]) == 3 and all(math.isfinite(x) for x in run["loss"]), run["loss"]
        assert run["tokens_per_s"] > 0 and run["peak_mem_bytes"] is None
    # same seed, same tokens, same weights: the first step's losses differ only by rounding
    assert doc["stock"]["loss"][0] == pytest.approx(doc["swapped"]["loss"][0], rel=1e-2)
    assert isinstance(doc["agrees"], bool) and math.isfinite(doc["max_rel_loss_diff"])
    assert doc["checkpoint_round_trip"] is True
    for trip in doc["checkpoint"].values():
        assert trip["weights_equal"] and trip["logits_rel_diff"] <= doc["tolerance"]["checkpoint_logits_rel"]


def test_bigram_stream_is_seeded_and_in_vocab():
    a = train_titan.token_stream(3, 2, 4, 16, 100)
    assert a.shape == (2, 4, 17) and int(a.min()) >= 0 and int(a.max()) < 100
    assert train_titan.token_stream(3, 2, 4, 16, 100).equal(a)
    assert not train_titan.token_stream(4, 2, 4, 16, 100).equal(a)


def test_compare_losses_tolerance():
    stock = [8.0 - 0.01 * i for i in range(100)]
    near = [x * 1.01 for x in stock]
    assert train_titan.compare_losses(stock, near)["agrees"]
    early_miss = list(near)
    early_miss[10] = stock[10] * 1.05
    assert not train_titan.compare_losses(stock, early_miss)["agrees"]
    drift = stock[:80] + [x * 1.03 for x in stock[80:]]
    assert not train_titan.compare_losses(stock, drift)["agrees"]
    assert not train_titan.compare_losses(stock, stock[:-1] + [math.nan])["agrees"]
    # the bars a control run sets (wider where rounding alone parts the curves more)
    assert train_titan.compare_losses(stock, early_miss, early_rtol=0.06)["agrees"]
    assert not train_titan.compare_losses(stock, early_miss, early_rtol=0.04)["agrees"]
    assert train_titan.compare_losses(stock, drift, final_rtol=0.031)["agrees"]
    assert not train_titan.compare_losses(stock, drift, final_rtol=0.029)["agrees"]


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        train_titan.parse_args(["--steps", "0", "--device", "cpu"])
    with pytest.raises(SystemExit):
        train_titan.parse_args(["--device", "cpu", "--attn", "flex"])
    with pytest.raises(SystemExit):
        train_titan.parse_args(["--smoke", "--device", "cuda"])


def test_recipe_is_the_registrys():
    """training_recipe() builds what TorchTitan's debugmodel recipe holds for the optimizer, the
    schedule and clipping (the registry module needs ``datasets``: skipped without it)."""
    pytest.importorskip("datasets", reason="the registry's recipe imports the datasets package")
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    want, got = deepseek_v3_debugmodel(), train_titan.training_recipe()
    assert got.optimizer == want.optimizer
    assert got.lr_scheduler == want.lr_scheduler
    assert got.training.max_norm == want.training.max_norm


@pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")
def test_control_run_is_recorded(tmp_path):
    """--control trains the stock model once more from perturbed weights: the JSON holds its
    curve and its distances from stock, which the perturbation makes nonzero."""
    out = tmp_path / "c.json"
    assert train_titan.main(["--smoke", "--steps", "2", "--control", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    control = doc["control"]
    assert control["perturbation_log2"] == train_titan.CONTROL_LOG2
    assert len(control["run"]["loss"]) == 2 and all(math.isfinite(x) for x in control["run"]["loss"])
    assert control["max_abs_loss_diff"] > 0 and "agrees" not in control
    # the bars: the fixed ones, or the control's own parting times the margin where larger
    tol = doc["tolerance"]
    assert tol["control_margin"] == train_titan.CONTROL_MARGIN
    assert tol["early_rel"] == max(train_titan.EARLY_RTOL,
                                   train_titan.CONTROL_MARGIN * control["early_max_rel_loss_diff"])
    assert tol["final_window_rel"] == max(train_titan.FINAL_RTOL,
                                          train_titan.CONTROL_MARGIN * control["final_window_rel_loss_diff"])
