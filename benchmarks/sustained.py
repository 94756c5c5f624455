"""Each row run in a long stretch of calls while nvidia-smi samples SM clock and power.

    python3 benchmarks/sustained.py dsv3 [--seconds 3] [--passes 2] [--variants engine,quack,t128c1m2,...]
        [--no-dbias] [--out F.json]

Why: a row's median in bench_dglu.py can depend on what ran before it (the H200 lowers its
clocks under sustained power). This prints, per row and pass, the median ms of the calls of
that stretch with the mean SM clock (MHz), mean power (W) and top temperature (C) that
nvidia-smi reported during it, and the energy (mJ) and SM cycles (millions) per call
derived from them, so that kernels are compared at the clocks they run at. Calls are queued
in batches of 50 and synchronized after each batch (a short idle gap per batch). nvidia-smi's
power.draw is an average over about a second, so the first ``--settle`` seconds of each
stretch (default 1) are left out of its figures; rows rotate by one place per pass.

Where NVML's library is present it also reads the GPU's energy counter around each stretch
(``NvmlEnergy``: exact over the stretch, where power.draw is a ~1 s average) and prints
``nvml_mj_per_call``, the stretch's energy over its calls (the idle gap after each batch of
50 included).
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dglu import (SHAPES, group_sizes, make_inputs, make_quack,  # noqa: E402
                        round_robin_order, run_cudnn_ext, run_grouped_mm, variant_knobs)


class SmiSampler:
    """nvidia-smi's clocks.sm, power.draw and temperature.gpu every 100 ms, time-stamped
    on arrival (host monotonic clock), in a background thread."""

    def __init__(self):
        self.samples = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
             "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts, temp = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), mhz, watts, temp))

    def window(self, t0, t1):
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return {}
        return {"sm_mhz": statistics.mean(x[1] for x in s),
                "power_w": statistics.mean(x[2] for x in s),
                "temp_c_max": max(x[3] for x in s), "samples": len(s)}

    def stop(self):
        self.proc.terminate()


class NvmlEnergy:
    """The GPU's total energy counter in mJ (NVML ``nvmlDeviceGetTotalEnergyConsumption``,
    Volta and later), read through ctypes from ``libnvidia-ml.so.1``: no Python package
    needed on the device. ``index`` is NVML's device index (the only GPU on a lent
    machine: 0). Raises OSError where the library or the counter is missing."""

    def __init__(self, index=0, lib=None):
        self.lib = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index),
                                                            ctypes.byref(self.handle)),
                    "nvmlDeviceGetHandleByIndex_v2")

    @staticmethod
    def _check(rc, what):
        if rc != 0:  # NVML_SUCCESS
            raise OSError(f"{what} returned NVML error {rc}")

    def total_mj(self):
        value = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle,
                                                                 ctypes.byref(value)),
                    "nvmlDeviceGetTotalEnergyConsumption")
        return value.value


def open_energy():
    """An NvmlEnergy, or None (with the reason printed) where NVML cannot be read."""
    try:
        return NvmlEnergy()
    except OSError as exc:
        print(f"NVML energy counter unavailable: {exc}")
        return None


def per_call(row):
    """Energy (mJ: mean W x median ms) and SM cycles (millions) per call of a stretch. At the
    power cap the time of a call is its energy over the cap, so energy ranks kernels there;
    cycles rank them at equal clocks."""
    if "power_w" not in row:
        return {}
    return {"mj_per_call": row["power_w"] * row["ms"],
            "mcycles_per_call": row["sm_mhz"] * row["ms"] / 1000.0}


def stretch(fn, seconds, batch_size=50):
    """Call ``fn`` for ``seconds`` in batches of ``batch_size`` queued calls (synchronized
    after each batch), timing each call with CUDA events. Returns (median ms, calls)."""
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        batch = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(batch_size)]
        for s, e in batch:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) for s, e in batch]
    return statistics.median(times), len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds at the start of each stretch left out of the nvidia-smi figures")
    ap.add_argument("--variants", default="t128c1m2h2,t256c4m2s3k",
                    help="cudnn_ext knob sets (bench_dglu.variant_knobs), 'engine' (the "
                         "engine's choice) and 'quack' (the quack peer), comma-separated")
    ap.add_argument("--no-dbias", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    L, per, K, N = SHAPES[args.shape]
    pack = make_inputs(group_sizes(args.shape, L, per), K, N)
    dbias = not args.no_dbias
    if not dbias:
        pack["dbias"] = None
    rows = {"torch_grouped_mm": run_grouped_mm(pack)}
    for v in filter(None, args.variants.split(",")):
        if v == "engine":  # the engine's own choice
            rows["cudnn_ext"] = run_cudnn_ext(pack, K, N, None, dbias=dbias)[0]
        elif v == "quack":
            rows["quack"] = make_quack(pack, N)
        else:
            rows[f"cudnn_ext[{v}]"] = run_cudnn_ext(pack, K, N, variant_knobs(v), dbias=dbias)[0]
    for fn in rows.values():
        fn()
    torch.cuda.synchronize()
    smi, out, energy = SmiSampler(), [], open_energy()
    try:
        time.sleep(1.0)
        for p, order in enumerate(round_robin_order(list(rows), args.passes)):
            for name in order:
                t0 = time.monotonic()
                e0 = energy.total_mj() if energy else None
                ms, n = stretch(rows[name], args.seconds)
                row = {"shape": args.shape, "impl": name, "pass": p, "ms": ms, "calls": n,
                       **smi.window(t0 + args.settle, time.monotonic())}
                if energy:
                    row["nvml_mj_per_call"] = (energy.total_mj() - e0) / n
                row.update(per_call(row))
                out.append(row)
                print(f"{args.shape:8s} {name:24s} pass {p}  {ms:7.3f} ms  "
                      f"{row.get('sm_mhz', 0):6.0f} MHz  {row.get('power_w', 0):5.0f} W  "
                      f"{row.get('mj_per_call', 0):7.1f} mJ  "
                      f"(NVML {row.get('nvml_mj_per_call', float('nan')):7.1f} mJ)  "
                      f"{row.get('mcycles_per_call', 0):6.3f} Mcyc  "
                      f"{row.get('temp_c_max', 0):3.0f} C  ({n} calls)", flush=True)
    finally:
        smi.stop()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(),
                       "date": time.strftime("%Y-%m-%d"), "dbias": dbias, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
