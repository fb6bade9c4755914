"""The Ray side: a detached controller that turns a plan into running replicas and keeps the
routing table, and one replica actor per placement that runs its engine process."""
