"""Runtime plumbing, below everything that knows the operation: streams (``streams``), the
caller-owned workspace's layout, checks and pool (``workspace``), the generic call memo
(``memo``) and its C++ metadata guards (``guards``), occupancy queries (``occupancy``), the
disk compile cache (``compile_cache``) and shared libraries (``shared_library``), and the
registry of every in-process cache with :func:`clear_caches` (``caches``). Imports nothing of
the package but ``version`` (``tests/unit/test_layering.py``)."""
from .caches import clear_caches  # noqa: F401
