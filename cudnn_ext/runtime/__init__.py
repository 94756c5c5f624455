"""Runtime plumbing between the contract and the engines: streams (``streams``), the
caller-owned workspace's layout and checks (``workspace``), the per-call metadata memo
(``memo``) and the zero-copy bridge from JAX arrays to torch views (``jax_arrays``, which
imports jax only when a JAX array arrives). Imports nothing above ``contract``."""
