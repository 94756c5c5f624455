"""Run one implementation a few times on one benchmark shape (for ncu / nsys).

    ncu --clock-control none --kernel-name regex:Dglu --launch-skip 2 --launch-count 1 \
        python3 benchmarks/profile_one.py qwen3 [--no-dbias] [--variant t256c2m2k] [--grouped-mm]

``--variant`` takes bench_dglu.py's variant syntax (default: the engine's choice);
``--grouped-mm`` runs torch._grouped_mm on the same inputs instead (profile its kernel with
``--kernel-name regex:device_kernel``).
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_dglu import (SHAPES, group_sizes, make_inputs, run_cudnn_ext, run_grouped_mm,  # noqa: E402
                        variant_knobs)

if __name__ == "__main__":
    args = sys.argv[1:]
    name = args[0] if args and not args[0].startswith("--") else "qwen3"
    dbias = "--no-dbias" not in args
    variant = args[args.index("--variant") + 1] if "--variant" in args else None
    L, per, K, N = SHAPES[name]
    pack = make_inputs(group_sizes(name, L, per), K, N)
    if not dbias:
        pack["dbias"] = None
    if "--grouped-mm" in args:
        fn, info = run_grouped_mm(pack), "torch._grouped_mm"
    else:
        fn, info = run_cudnn_ext(pack, K, N, knobs=variant_knobs(variant) if variant else None,
                                 dbias=dbias)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    print(name, info)
