"""Every ```python block of README.md and docs/*.md runs as written.

One test per file: its blocks run in order in one fresh namespace, as a reader pastes them
(a block may use the names of the blocks before it). A block whose first line is
``# needs a GPU`` is skipped without CUDA; one whose first line is ``# needs jax`` is skipped
where jax cannot be imported, and so is every block of docs/jax.md; ``# needs torchtitan``
skips a block where torchtitan's MoE module cannot be imported (the ``titan`` extra). A failure
names the file and the line where the failing block starts.
"""
import importlib.util
import pathlib
import re
import traceback

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)
HAS_JAX = importlib.util.find_spec("jax") is not None


def _has_torchtitan() -> bool:
    # its MoE module, not just the package: that module also needs triton
    try:
        import torchtitan.models.common.moe  # noqa: F401
    except ImportError:
        return False
    return True


def python_blocks(text):
    """[(line of the opening fence, 1-based; code)] of every ```python block."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def skip_reason(path, code):
    first = code.lstrip().splitlines()[0].strip() if code.strip() else ""
    if first == "# needs a GPU" and not torch.cuda.is_available():
        return "needs a GPU"
    if (first == "# needs jax" or path.name == "jax.md") and not HAS_JAX:
        return "needs jax (pip install '.[jax]')"
    if first == "# needs torchtitan" and not _has_torchtitan():
        return "needs torchtitan (pip install '.[titan]')"
    return None


def test_block_extraction_finds_fences_and_lines():
    text = "# t\n\n```python\nx = 1\n```\n\ntext\n```bash\nls\n```\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (11, "y = x + 1\n")]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_doc_python_blocks_run(path):
    rel = path.relative_to(ROOT)
    blocks = python_blocks(path.read_text())
    if not blocks:
        pytest.skip(f"{rel} has no python blocks")
    namespace = {"__name__": f"docs:{rel}"}
    skipped = []
    for line, code in blocks:
        why = skip_reason(path, code)
        if why:
            skipped.append(f"line {line}: {why}")
            continue
        try:
            exec(compile(code, f"{rel}:{line}", "exec"), namespace)
        except Exception as exc:
            pytest.fail(f"{rel}: the python block at line {line} raised "
                        f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", pytrace=False)
    if skipped and len(skipped) == len(blocks):
        pytest.skip(f"{rel}: every block skipped ({'; '.join(skipped)})")
