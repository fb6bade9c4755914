"""The one cost model, shared by the planner, the simulated engine and the simulator: a forward
step (`costmodel`), a KV cache moved between replicas (`kvtransfer`), NCCL's collectives
(`collectives`), the MoE step of an expert-parallel gang (`moecost`) and its all-to-all
(`alltoall`), pipeline stages (`pipeline`), a gang's step (`gang`), the model and GPU
catalogues with their sourced data (`catalog`, `data/`), and the `cost` command's queries
(`queries`; a gang's: `gangqueries`; `cli`). Pure: imports `topology` (link kinds and paths) only, no I/O module."""

import wire  # noqa: F401  (wire decides first whether the cost model runs compiled)
from physics import fitted as _fitted

_fitted.apply()  # the free constants at their fit to every published point (`physics.fitted`)
