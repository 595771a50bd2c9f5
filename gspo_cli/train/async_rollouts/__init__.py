"""Asynchronous rollouts: a worker process per rank samples ahead while the trainer trains."""
