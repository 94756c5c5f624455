"""Run one implementation a few times on one benchmark shape, for a profiler (ncu, nsys).

    ncu --clock-control none --kernel-name regex:Dglu --launch-skip 2 --launch-count 1 \\
        python3 benchmarks/profile_one.py qwen3 [--no-dbias] [--variant t256c2m2k] [--grouped-mm]

``--variant`` takes bench_dglu.py's variant syntax (default: the engine's choice);
``--grouped-mm`` runs torch._grouped_mm on the same inputs instead (profile its kernel with
``--kernel-name regex:device_kernel``). Needs a Hopper GPU.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dglu import (SHAPES, group_sizes, make_inputs, run_cudnn_ext, run_grouped_mm,  # noqa: E402
                        variant_knobs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", default="qwen3", choices=sorted(SHAPES))
    ap.add_argument("--no-dbias", action="store_true", help="run cudnn_ext without dbias")
    ap.add_argument("--variant", default=None,
                    help="cudnn_ext knob set in bench_dglu.py's syntax, e.g. t256c2m2k")
    ap.add_argument("--grouped-mm", action="store_true",
                    help="run torch._grouped_mm on the same inputs instead")
    ap.add_argument("--calls", type=int, default=4, help="calls to run (default 4)")
    args = ap.parse_args(argv)
    L, per, K, N = SHAPES[args.shape]
    dbias = not args.no_dbias
    pack = make_inputs(group_sizes(args.shape, L, per), K, N)
    if not dbias:
        pack["dbias"] = None
    if args.grouped_mm:
        fn, info = run_grouped_mm(pack), "torch._grouped_mm"
    else:
        knobs = variant_knobs(args.variant) if args.variant else None
        fn, info = run_cudnn_ext(pack, K, N, knobs=knobs, dbias=dbias)
    for _ in range(args.calls):
        fn()
    torch.cuda.synchronize()
    print(args.shape, info)


if __name__ == "__main__":
    main()
