"""benchmarks/sustained.py's bookkeeping on the CPU: nvidia-smi lines parsed into samples,
samples averaged per time window, energy and cycles per call. (What it measures runs on a
GPU only; these check the bookkeeping: a window averages the samples stamped inside it.)"""
import time
from types import SimpleNamespace

import pytest

import sustained


def _sampler(lines):
    s = sustained.SmiSampler.__new__(sustained.SmiSampler)  # no nvidia-smi process
    s.samples, s.proc = [], SimpleNamespace(stdout=iter(lines))
    s._read()
    return s


def test_lines_parse_and_unreadable_ones_are_skipped():
    s = _sampler(["1400, 690.5, 52\n", "[N/A], [N/A], 50\n", "\n", "1300, 600, 55\n"])
    assert [x[1:] for x in s.samples] == [(1400.0, 690.5, 52.0), (1300.0, 600.0, 55.0)]


def test_window_averages_only_its_own_samples():
    s = _sampler([])
    now = time.monotonic()
    s.samples = [(now - 10, 1980.0, 100.0, 40.0), (now, 1400.0, 700.0, 52.0),
                 (now + 1, 1200.0, 690.0, 56.0), (now + 10, 345.0, 80.0, 35.0)]
    w = s.window(now - 0.5, now + 1.5)
    assert w["sm_mhz"] == pytest.approx(1300.0) and w["power_w"] == pytest.approx(695.0)
    assert w["temp_c_max"] == 56.0 and w["samples"] == 2
    assert s.window(now + 2, now + 3) == {}


def test_per_call_energy_and_cycles():
    assert sustained.per_call({"ms": 1.0}) == {}  # no samples in the window: nothing derived
    got = sustained.per_call({"ms": 2.0, "power_w": 700.0, "sm_mhz": 1500.0})
    assert got == {"mj_per_call": pytest.approx(1400.0), "mcycles_per_call": pytest.approx(3.0)}


class _FakeNvml:
    """NVML's three calls as NvmlEnergy makes them: return codes, results through byref."""

    def __init__(self, energy_mj=(1000, 4500), init_rc=0):
        self.energy, self.init_rc, self.handles = list(energy_mj), init_rc, []

    def nvmlInit_v2(self):
        return self.init_rc

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle_ref):
        self.handles.append(index.value)
        handle_ref._obj.value = 0xABC
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, value_ref):
        assert handle.value == 0xABC  # the handle NVML gave back
        if not self.energy:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        value_ref._obj.value = self.energy.pop(0)
        return 0


def test_nvml_energy_reads_the_counter_through_its_handle():
    lib = _FakeNvml()
    e = sustained.NvmlEnergy(index=0, lib=lib)
    assert lib.handles == [0]
    assert (e.total_mj(), e.total_mj()) == (1000, 4500)
    with pytest.raises(OSError, match="nvmlDeviceGetTotalEnergyConsumption returned NVML error 3"):
        e.total_mj()


def test_nvml_energy_refuses_when_nvml_does_not_start():
    with pytest.raises(OSError, match="nvmlInit_v2 returned NVML error 9"):
        sustained.NvmlEnergy(lib=_FakeNvml(init_rc=9))


def test_open_energy_degrades_to_none_without_nvml(monkeypatch, capsys):
    def missing(*_a, **_k):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    monkeypatch.setattr(sustained, "NvmlEnergy", missing)
    assert sustained.open_energy() is None
    assert "NVML energy counter unavailable" in capsys.readouterr().out
