"""Autoscaling prefill and decode pools: a pure policy (`on_tick(observations) -> actions`, as
Dynamo's SLA planner and Ray Serve's autoscaling policy are written), topology-aware choices of
what to remove. The controller and the simulator act on its decisions; nothing here does I/O."""
