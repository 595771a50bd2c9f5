"""Training: the RL loop, cold-start SFT, engines, checkpoints and the run folder."""
