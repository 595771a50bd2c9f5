"""A run from recipe to finished folder: prepare, loop, cold start, checkpoints, resume, guards."""
