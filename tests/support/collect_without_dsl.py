"""``python tests/support/collect_without_dsl.py [pytest args]``: pytest --collect-only as on
a machine without the GPU packages (the README's CPU install: no nvidia-cutlass-dsl, no
cuda-python, no tvm_ffi). Their imports fail and ``importlib.util.find_spec`` finds nothing,
as there; exits with pytest's status (collection errors: non-zero)."""
import importlib.util
import sys

ABSENT = ("cutlass", "cuda", "tvm_ffi")


class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main(argv) -> int:
    sys.meta_path.insert(0, _Absent())
    find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, package=None: (
        None if name.split(".")[0] in ABSENT else find_spec(name, package))
    import pytest

    return pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"] + (argv or ["tests"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
