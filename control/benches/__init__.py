"""The controller's link benchmarks: when to measure what (`schedule`), one node's bench on this
host (`local`) and on a Ray node (`tasks`). `control.benching` runs them."""
