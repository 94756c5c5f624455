"""Run the cudnn_ext SM90 engine a few times on one benchmark shape (for ncu / nsys).

    ncu --clock-control none --kernel-name regex:Dglu --launch-skip 2 --launch-count 1 \
        python3 benchmarks/profile_one.py qwen3
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_dglu import SHAPES, group_sizes, make_inputs, run_cudnn_ext  # noqa: E402

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
    dbias = "--no-dbias" not in sys.argv
    L, per, K, N = SHAPES[name]
    pack = make_inputs(group_sizes(name, L, per), K, N)
    if not dbias:
        pack["dbias"] = None
    fn, info = run_cudnn_ext(pack, K, N, dbias=dbias)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    print(name, info)
