"""One fresh process asking the compile cache for a kernel: the helper of
tests/compile/test_compile_cache.py and tests/gpu/test_compile_cache_gpu.py.

``python tests/support/compile_cache_child.py KIND [--wait-for PATH]`` (KIND: ``gather``, the
small pointer-table gather in the DSL's own calling convention; ``zero_tail``, the layer's
tail zeroing, and ``sm90``, one SM90 kernel config, in the TVM-FFI convention when
apache-tvm-ffi is installed). With ``--wait-for`` it imports everything first, creates
``PATH.ready<pid>`` and then waits for PATH to exist, so that several children start their
lookup together. Prints one JSON line: the cache's events of this process, the seconds the
lookup took (from asking to holding the compiled function), whether ``cutlass`` was imported
by then, and the warnings the lookup raised."""
import argparse
import json
import os
import pathlib
import sys
import time
import warnings

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # a CPU-only process compiles for Hopper


def sm90_config():
    import torch

    from cudnn_ext.engines.sm90 import config_for
    from cudnn_ext.problem import ActConfig, DgluProblem

    p = DgluProblem(n=256, k=512, num_experts=4, m=1024, weight_mode="dense", b_major="k",
                    ab_dtype=torch.bfloat16, c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                    act=ActConfig(act_func="dswiglu"), generate_dbias=True, device_type="cuda")
    return config_for(p, tile_n=128)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("gather", "zero_tail", "sm90"))
    ap.add_argument("--wait-for")
    args = ap.parse_args()
    import torch  # noqa: F401  (outside the timing, as in a torch process: apache-tvm-ffi imports it)

    from cudnn_ext.runtime import compile_cache

    if args.kind == "sm90":
        from cudnn_ext.engines import sm90

        cfg = sm90_config()
        import cudnn_ext.kernels.sm90.launch  # noqa: F401  (imports outside the timing)

        get = lambda: sm90.compile_cached(cfg)  # noqa: E731
    elif args.kind == "zero_tail":
        from cudnn_ext.kernels.layer import launch

        get = launch.zero_tail_cached
    else:
        from cudnn_ext.kernels import pointer_gather

        pointer_gather._dsl()
        get = lambda: pointer_gather.compile_gather("sm_90a")  # noqa: E731
    if args.wait_for:
        pathlib.Path(f"{args.wait_for}.ready{os.getpid()}").touch()
        while not pathlib.Path(args.wait_for).exists():
            time.sleep(0.005)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        fn = get()
        seconds = time.perf_counter() - t0
    print(json.dumps({"events": compile_cache.events, "seconds": seconds,
                      "callable": callable(fn), "cutlass": "cutlass" in sys.modules,
                      "warnings": [str(w.message) for w in caught]}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
