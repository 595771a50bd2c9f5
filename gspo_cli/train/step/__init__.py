"""One RL step: collection, dynamic sampling, pi_old, routing replay, micro-batches, update."""
