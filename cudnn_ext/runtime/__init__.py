"""Runtime plumbing below the engines: streams (``streams``) and the caller-owned workspace's
layout and checks (``workspace``). Imports only torch and the package's leaf modules."""
