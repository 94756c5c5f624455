"""Runtime plumbing between the contract and the engines: streams (``streams``), the
caller-owned workspace's layout and checks (``workspace``), the per-call metadata memo
(``memo``), the zero-copy bridge from JAX arrays to torch views (``jax_arrays``, which
imports jax only when a JAX array arrives) and the device gather of the buffers a pointer
table names (``pointer_gather``, which imports the CuTe DSL only when it runs). Imports
nothing above ``contract``."""
