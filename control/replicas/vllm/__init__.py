"""Real vLLM replicas: the OpenAI server's command line and environment from a replica's plan
(`command`), and the process that runs it (`process`). Imports `pools` (the controller's launch
spec, ports and pinning) and `wire`; never the router."""
