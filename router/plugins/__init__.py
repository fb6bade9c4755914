"""Routing as plugins (llm-d's shape): filters, weighted scorers in [0, 1] and pickers, one
registry of them by kebab-case name (`registry.PLUGINS`), profiles that compose them from config
(`profile.Profile`), the PD profile (`pd`) that prices prefill/decode pairs and mixed replicas
by predicted TTFT (`ttft`), and the one metric that times every plugin (`timing`)."""
