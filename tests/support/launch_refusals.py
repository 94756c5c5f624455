"""A kernel launch's argument checks, on the CPU: the call raises the named ``ValueError`` and
nothing was compiled or cached for it (the checks come before the kernel is looked up)."""
import pytest


def assert_refused_before_compiling(launch_module, entry: str, args: dict, match: str, *leading) -> None:
    """``launch_module.<entry>(*leading, **args)`` raises a ``ValueError`` matching ``match``
    and leaves the module's kernel cache (``_kernels.compiled``) as it was."""
    before = dict(launch_module._kernels.compiled)
    with pytest.raises(ValueError, match=match):
        getattr(launch_module, entry)(*leading, **args)
    assert launch_module._kernels.compiled == before
