"""What runs where: pool specs, placement policies, the cost model, plans, the Ray controller,
engine launchers. Built on `topology`; the placement issue fills it in."""
