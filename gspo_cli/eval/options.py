"""`gspo eval`'s command-line options (the command's signature stays one line per flag)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

CheckpointArg = Annotated[
    str, typer.Argument(help="HF checkpoint folder, .gguf file, run folder or builtin:NAME.")
]
BenchmarkOpt = Annotated[
    str | None,
    typer.Option(help="aime24, aime25, math500, gsm8k, livecodebench, codeforces, custom."),
]
TemperatureOpt = Annotated[float | None, typer.Option(help="Sampling temperature (default 0.6).")]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling (default 0.95).")]
MaxNewTokensOpt = Annotated[
    int | None, typer.Option("--max-new-tokens", help="Response cap (default 1024).")
]
EvalDataOpt = Annotated[
    str | None, typer.Option(help="Local file or folder with the benchmark's data.")
]
StandingsOpt = Annotated[str | None, typer.Option(help="CodeForces: CodeElo standings cache.")]
EvalEngineOpt = Annotated[
    str | None, typer.Option(help="Rollout engine: hf or vllm (default: the recipe's, or hf).")
]
EvalOutOpt = Annotated[Path | None, typer.Option(help="Output folder (default evals/BENCHMARK).")]
EvalResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Skip problems already done in --out.")
]
EvalRecipeOpt = Annotated[
    Path | None,
    typer.Option(
        help="Take defaults from this recipe's eval section and its data.chat_template(_kwargs); "
        "`custom` problems get its data.prompt_template and system_prompt, as in training."
    ),
]
PromptTemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--prompt-template",
        help="Format each question with this ({prompt} = the question) instead of the "
        "benchmark's instruction.",
    ),
]
StepsOpt = Annotated[
    str | None,
    typer.Option(
        help="With a run folder: evaluate its checkpoints as one curve, all or steps such as "
        "50,100 (output RUN/eval/BENCHMARK-curve; resumable)."
    ),
]
