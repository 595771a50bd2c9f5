"""The `gspo` command line: thin Typer wrappers, no logic of their own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from gspo_cli.errors import GspoError
from gspo_cli.recipe import Recipe, RecipeError, load_recipe

app = typer.Typer(
    name="gspo",
    help="GSPO / GSPO-token / GRPO post-training driven by YAML recipes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a key: --set algorithm.clip_high=4e-4 (repeatable)."),
]


def _summary(recipe: Recipe) -> str:
    algo, rollout = recipe.algorithm, recipe.rollout
    return (
        f"{recipe.name}: {algo.name} (clip {algo.clip_low:g}/{algo.clip_high:g}, "
        f"{algo.loss_agg}), model {recipe.model.path}, data {recipe.data.source}, "
        f"{recipe.trainer.steps} steps x {rollout.num_prompts} prompts x {rollout.group_size} "
        f"samples, {algo.minibatches} minibatches"
    )


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe; exit 0 with a summary or 2 with one line per problem."""
    resolved = load_recipe(recipe, set_)
    console.print(f"[green]ok[/green] {_summary(resolved)}", highlight=False)


@app.command()
def show(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Print the fully resolved recipe (defaults < base < recipe < --set) as YAML."""
    resolved = load_recipe(recipe, set_)
    typer.echo(dump_recipe_yaml(resolved), nl=False)


OutOpt = Annotated[
    Path | None, typer.Option("--out", help="Run folder (default: trainer.out_dir/NAME).")
]


@app.command()
def train(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: OutOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a stopped run.")] = False,
) -> None:
    """Run RL training (cold start first when the recipe enables it)."""
    from gspo_cli.train.loop import train as run_training

    resolved = load_recipe(recipe, set_)
    console.print(f"[bold]gspo train[/bold] {_summary(resolved)}", highlight=False)
    run_training(resolved, dump_recipe_yaml(resolved), out=out, resume=resume, console=console)


@app.command()
def sft(recipe: RecipeArg, set_: SetOpt = None, out: OutOpt = None) -> None:
    """Only the cold start: fine-tune on worked solutions and save an HF checkpoint."""
    from gspo_cli.train.loop import run_sft_only

    resolved = load_recipe(recipe, set_)
    run_sft_only(resolved, dump_recipe_yaml(resolved), out=out, console=console)


def dump_recipe_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def _quiet_libraries() -> None:
    """Our own progress display replaces the libraries' bars and info logs."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    """Console-script entry: user errors become one line per problem and exit code 2."""
    _quiet_libraries()
    try:
        app()  # Typer/click handle usage errors themselves (exit 2).
    except RecipeError as exc:
        for problem in exc.problems:
            _error(f"{exc.source}: {problem}")
        sys.exit(2)
    except GspoError as exc:
        _error(str(exc))
        sys.exit(2)


def _error(line: str) -> None:
    err_console.print(f"[red]error:[/red] {line}", highlight=False, soft_wrap=True, markup=True)


if __name__ == "__main__":
    main()
