"""Workloads, the live load driver, the offline simulator and policy comparison. Built on every
layer below; the load-test issue fills it in."""
