"""Load tests of the whole product: workloads (`workload`, `workloads`), the live driver on
loopback (`live`), the offline simulator (`sim`), policy comparison and its report (`compare`,
`report`, `summary`), the simulator's calibration against live runs (`calibrate`), pool sizing
refined in the simulator (`refine`) and fault injection (`chaos`). The top layer: imports
every other package; nothing imports it."""

import wire  # noqa: F401  (wire decides first whether the simulator runs compiled)
