"""The model-forward wing: what a training or rollout forward computes, and which fast paths
it may take (capabilities.py)."""
