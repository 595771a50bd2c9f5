"""Training, in four wings, top first (each imports only the wings below it):

- run/: a run's life: prepare, the loop, cold start, checkpoints, resume, guards, signals, logs;
- async_rollouts/: a rollout worker per rank that samples ahead while the trainer trains;
- step/: one RL step: collection (dynamic sampling), pi_old, routing replay, micro-batches, update;
- engines/: the training engines (plain torch, DeepSpeed), optimiser, process groups, launchers.
"""
