"""The cycle every side of vs_trl runs: 8 prompts x 8 samples, 4 minibatch updates."""

PROMPTS, SAMPLES, MINIBATCHES = 8, 8, 4
ROWS = PROMPTS * SAMPLES  # 64 responses per cycle
PROMPT_TOKENS = 16  # every prompt of the fixed and realistic workloads (no padding anywhere)
