"""Which GPU of an expert-parallel gang holds which experts (`python -m pools experts`).

    load        per-layer tokens per logical expert: read (vLLM EPLB statistics, a histogram) or
                generated (Zipf-skewed popularity, DeepSeek's group-limited routing), `load`
    policies    linear (vLLM's default: expert i on GPU i // per_gpu), eplb (DeepSeek's
                hierarchical balancer with hosts as its nodes, from its published description),
                topology (this project's: NVLink domains as the hierarchy, replicas of the hot
                experts spread over domains), `policies`
    metrics     every token goes to a replica of each of its experts inside its own domain when
                there is one, else to any replica; from that: each GPU's load, balancedness
                (mean over max), bytes per token crossing a domain, and the MoE step the cost
                model predicts for that load and traffic, `metrics`

Pure: no I/O outside `load.read_load`.
"""
