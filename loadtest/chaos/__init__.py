"""`python -m loadtest chaos`: the local simulated deployment under real faults (a replica crash,
a degraded link, a lost node, an overload burst) at 80 % of its capacity, with every request
accounted for. `run` drives it; `spec` reads configs/chaos.yaml; `cluster` brings the deployment
up and down; `capacity` finds its capacity in the simulator; `driver` and `load` send the
requests; `faults` does the faults; `report` and `checks` are the pure accounting and verdict.
Imports the live package (deployment, client) and every layer below."""
