"""A fresh process's time to its first kernel launch: the helper of
tests/gpu/test_compile_cache_gpu.py (needs an sm_90 GPU).

``python tests/support/first_launch_child.py`` (CUDNN_EXT_CACHE_DIR names the cache) imports
torch and cudnn_ext, makes its inputs on the GPU (CUDA context included), then times the first
``torch.ops.cudnn_ext.grouped_gemm_dglu`` call up to its results being ready (plan choice, the
compile (importing the CuTe DSL) or the disk cache's load, the launch, a synchronize). It checks
the results against the float64 reference and prints one JSON line: the seconds to the first
launch and their split (the compile cache's lookups, which include importing apache-tvm-ffi or
the DSL, and the rest: plan choice, resident-CTA query, launch, synchronize), the compile
cache's events, whether the process imported ``cutlass`` by the end of the first launch (and
from where, when it did), the relative errors, and the process's age at the end."""
import json
import sys
import time
import traceback

T_START = time.perf_counter()


class _FirstImport:
    """A meta-path finder that finds nothing and records the stack of the first import of
    ``cutlass`` (a warm process with the TVM-FFI convention and a C compiler should have none:
    docs/compile_cache.md, "How a kernel is loaded")."""

    stack = None

    def find_spec(self, name, path=None, target=None):
        if name == "cutlass" and self.stack is None:
            self.stack = [line.strip() for line in traceback.format_stack()
                          if "importlib" not in line][-8:]
        return None


_FIRST = _FirstImport()
sys.meta_path.insert(0, _FIRST)

import torch  # noqa: E402

import cudnn_ext.torch  # noqa: E402,F401
from cudnn_ext import contract  # noqa: E402
from cudnn_ext.reference import reference_outputs  # noqa: E402
from cudnn_ext.runtime import compile_cache  # noqa: E402


def rel(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def main():
    t_imported = time.perf_counter()
    L, N, K, M = 4, 256, 512, 1024
    g = dict(device="cuda")
    a = torch.randn(M, K, **g).to(torch.bfloat16)
    b = torch.randn(L, N, K, **g).to(torch.bfloat16)
    c = (2 * torch.randn(M, 2 * N, **g)).to(torch.bfloat16)
    offs = torch.tensor([256, 512, 768, 1024], dtype=torch.int32, **g)
    alpha, beta = torch.rand(L, **g) + 0.5, torch.rand(L, **g) + 0.5
    prob = torch.rand(M, **g)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    d_row, dprob, dbias = torch.ops.cudnn_ext.grouped_gemm_dglu(a, b, c, offs, alpha, beta, prob,
                                                                generate_dbias=True)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    cutlass = "cutlass" in sys.modules
    cache_s = sum(e[2] for e in compile_cache.events)
    ops = contract.Operands(a=a, c=c, padded_offsets=offs, alpha=alpha, beta=beta, prob=prob,
                            dprob=torch.zeros_like(prob), b=b.permute(1, 2, 0))
    problem, pack = contract.normalize(ops, contract.CallConfig(), generate_dbias=True)
    ref = reference_outputs(problem, pack)
    print(json.dumps({"first_launch_s": first, "import_s": t_imported - T_START,
                      "split": {"compile_cache_s": cache_s, "rest_s": first - cache_s},
                      "events": compile_cache.events,
                      "cutlass_imported": cutlass, "cutlass_first_imported_from": _FIRST.stack,
                      "err": {"d_row": rel(d_row, ref["d_row"]), "dprob": rel(dprob, ref["dprob"]),
                              "dbias": rel(dbias, ref["dbias"])},
                      "process_s": time.perf_counter() - T_START}))


if __name__ == "__main__":
    main()
