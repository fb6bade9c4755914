"""The Ray side: a detached controller that turns a plan into running replicas and keeps the
routing table, and one replica actor per placement that runs its engine process. Imports the
rest of `pools` (model, placement, vLLM launchers) and `topology` (readers, bench); never the
router."""
