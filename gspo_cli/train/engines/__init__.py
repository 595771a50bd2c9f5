"""Training engines (plain torch, DeepSpeed), the optimiser, process groups and launchers."""
