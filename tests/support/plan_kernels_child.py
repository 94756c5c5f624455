"""One fresh process serializing or deserializing a plan that compiles a real kernel: the
helper of tests/compile/test_plan_kernels.py.

``python tests/support/plan_kernels_child.py serialize OUT [--include-kernels]`` builds a CPU
graph whose plan (a test engine registered here) compiles the small pointer-table gather for
sm_90a through the persistent compile cache, and writes ``g.serialize(...)`` to OUT.
``python tests/support/plan_kernels_child.py deserialize IN`` deserializes IN. Both print one
JSON line: the compile cache's events of this process and the plan's kernel digests."""
import json
import os
import pathlib
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # a CPU-only process compiles for Hopper
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))  # test_graph's small CPU case

from cudnn_ext.engines import registry  # noqa: E402
from cudnn_ext.engines.base import CompiledPlan, Engine, Knobs  # noqa: E402
from cudnn_ext.reference.grouped_dglu import grouped_dglu_reference  # noqa: E402


class KernelPlan(CompiledPlan):
    """Compiles the gather at build (as the SM90 plan compiles its kernel) and runs the
    reference: what matters here is which compile-cache entry it used."""

    def __init__(self, engine, problem, knobs):
        from cudnn_ext.kernels import pointer_gather

        self.engine_name, self.problem, self.knobs = engine.name, problem, knobs
        pointer_gather.compile_gather("sm_90a")

    def kernel_digests(self):
        from cudnn_ext.runtime import compile_cache

        d = compile_cache.digest_for("gather", "pointer_gather")
        return [d] if d else []

    def execute(self, pack, workspace=None, stream=None):
        grouped_dglu_reference(self.problem, pack)


class KernelEngine(Engine):
    name = "test_kernel_plan"
    engine_id = 29950

    def check_support(self, problem):
        return []

    def knob_space(self, problem):
        return [Knobs.of(tile=1)]

    def cost(self, problem, knobs):
        return 0.0  # ahead of the reference

    def build(self, problem, knobs):
        return KernelPlan(self, problem, knobs)


def main():
    from cudnn_ext.runtime import compile_cache

    registry.register_engine(KernelEngine(), first=True)
    mode, path = sys.argv[1], pathlib.Path(sys.argv[2])
    if mode == "serialize":
        from test_graph import build_graph, make_case

        g, _ = build_graph(make_case())
        g.build()
        assert g.engine_name == KernelEngine.name, g.engine_name
        path.write_bytes(g.serialize(include_kernels="--include-kernels" in sys.argv))
    else:
        import cudnn_ext

        g = cudnn_ext.deserialize_plan(path.read_bytes())
    print(json.dumps({"events": compile_cache.events, "digests": g.execution_plan.kernel_digests()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
