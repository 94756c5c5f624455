import os

# JAX grabs 75% of GPU memory when it first touches the GPU. Tests in one process (and
# pytest-xdist workers sharing the GPU) allocate through torch and JAX both; a parallel GPU run
# otherwise fails with out-of-memory next to a JAX worker holding 107 GiB.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The persistent compile cache (runtime/compile_cache.py): a test session compiles into its own
# folder, not the user's ~/.cache/cudnn_ext, so a stale or hand-made entry there cannot change a
# result. Set CUDNN_EXT_CACHE_DIR to share one folder between runs on purpose.
if "CUDNN_EXT_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CUDNN_EXT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cudnn_ext_test_cache_")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_seed():
    # every test gets fresh random data unless it seeds itself; the seed is printed on failure
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed


@pytest.fixture
def graph_executions(monkeypatch):
    """The graphs whose plan runs during the test, in order: ``Graph.execute_pack`` (the one
    execute path of the graph API, the wrapper and the class API) is spied on, and the
    call-graph memo and the wrapper's call memo start empty."""
    import cudnn_ext
    from cudnn_ext.runtime import memo
    from cudnn_ext.graph import from_call

    seen = []
    real = cudnn_ext.Graph.execute_pack

    def spy(self, pack, workspace, stream):
        seen.append(self)
        return real(self, pack, workspace, stream)

    monkeypatch.setattr(cudnn_ext.Graph, "execute_pack", spy)
    from_call.clear_memo()
    memo.clear()
    return seen
