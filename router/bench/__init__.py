"""`python -m router bench`: the router's data plane measured on loopback against nginx and the
Rust vllm-router (`run`), in front of fast fake backends (`fake_backend`), with the load
generators (`load`), the maintained HTTP servers it was weighed against (`candidates`) and the
front-door attack probes (`probes`). Imports `router`, `pools` and `topology`; nothing in the
product imports it but `router.cli` (`python -m router bench`)."""
