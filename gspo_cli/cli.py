"""The `gspo` command line: thin Typer wrappers, no logic of their own."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from gspo_cli.core.engine_catalogue import TRAIN_ENGINES, multi_process_engines
from gspo_cli.core.errors import GspoError, Stopped
from gspo_cli.core.quiet import quiet_libraries
from gspo_cli.core.registry import UnknownNameError
from gspo_cli.eval.options import (
    BenchmarkOpt,
    CheckpointArg,
    EvalDataOpt,
    EvalEngineOpt,
    EvalOutOpt,
    EvalRecipeOpt,
    EvalResumeOpt,
    MaxNewTokensOpt,
    PromptTemplateOpt,
    StandingsOpt,
    StepsOpt,
    TemperatureOpt,
    TopPOpt,
)
from gspo_cli.recipe import Recipe, RecipeError, dump_recipe_yaml, load_recipe
from gspo_cli.recipe.loader import recipe_from_overrides
from gspo_cli.recipe.summary import summary_line
from gspo_cli.runs.folder import COLD_START, EVAL_DIR, HF_CONFIG, run_dir_of, write_error
from gspo_cli.train.run.preflight import check_model_fit
from gspo_cli.train.run.signals import (
    INTERRUPT_EXIT,
    eval_stop_message,
    stop_message,
    stop_on_signals,
)

app = typer.Typer(
    name="gspo",
    help="GSPO / GSPO-token / GRPO post-training driven by YAML recipes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Paths, commands and recipe values are printed verbatim: rich markup would eat `[v2]` in a path
# and `[q_proj,v_proj]` in a printed --set. Styled words are Text, never markup.
console = Console(markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False)

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a key: --set algorithm.clip_high=4e-4 (repeatable)."),
]


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe; exit 0 with a summary or 2 with one line per problem."""
    resolved = load_recipe(recipe, set_)
    check_model_fit(recipe, resolved, hub=False)
    console.print(Text.assemble(("ok", "green"), f" {summary_line(resolved)}"))


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
    nproc: Annotated[
        int, typer.Option("--nproc", min=1, help="Processes per node (DeepSpeed engine).")
    ] = 1,
    hostfile: Annotated[
        Path | None, typer.Option(help="DeepSpeed hostfile: train over ssh, --nproc on each host.")
    ] = None,
    branch: Annotated[
        Path | None,
        typer.Option("--from", help="Branch: a new run from this checkpoint (or run's latest)."),
    ] = None,
    step: Annotated[
        int | None, typer.Option(help="With --from RUN: its step_N checkpoint.")
    ] = None,
) -> None:
    """Run RL training (cold start first when the recipe enables it)."""
    resolved = load_recipe(recipe, set_)  # a bad recipe fails before the heavy imports below
    run_dir = run_dir_of(resolved.trainer.out_dir, resolved.name, out)
    if (branch is not None and resume) or (step is not None and branch is None):
        raise GspoError(
            "--from starts a new run (--step picks its checkpoint); --resume continues one"
        )
    if resume:
        _check_resumed_files(resolved, run_dir)
    check_model_fit(recipe, resolved, hub=True)
    _before_the_folder(resolved, nproc, hostfile)
    stop_line = _stop_line(lambda: stop_message(run_dir, sys.argv[1:]))
    with stop_line, _writer(run_dir, "gspo train", resume):
        if branch is not None and "LOCAL_RANK" not in os.environ:  # the launcher branches
            from gspo_cli.train.run.branch import start_branch

            start_branch(branch, step, run_dir, dump_recipe_yaml(resolved), console)
        resume = resume or branch is not None  # a branch is resumed from its checkpoint
        from gspo_cli.train.engines.launch import launch, rank_dies_with_launcher, under_launcher

        rank_dies_with_launcher()

        if (nproc > 1 or hostfile) and not under_launcher():
            if not TRAIN_ENGINES.get(resolved.trainer.engine).several_processes:
                engines = multi_process_engines()
                raise GspoError(f"--nproc/--hostfile need trainer.engine: {engines} in the recipe")
            if resume:  # here, not in rank 0 alone: its refusal would leave the others waiting
                from gspo_cli.train.run.resume import check_resumable

                check_resumable(run_dir, dump_recipe_yaml(resolved))
            raise typer.Exit(launch(recipe, set_ or [], resolved, run_dir, resume, nproc, hostfile))
        from gspo_cli.train.run.loop import train as run_training  # not in a launcher: ranks do

        yaml_text = dump_recipe_yaml(resolved)
        run_training(resolved, yaml_text, run_dir=run_dir, resume=resume, console=console)


@app.command()
def sft(recipe: RecipeArg, set_: SetOpt = None, out: OutOpt = None) -> None:
    """Only the cold start: supervised fine-tuning, saved as an HF checkpoint."""
    resolved = load_recipe(recipe, set_)  # a bad recipe fails before the heavy imports below
    run_dir = run_dir_of(resolved.trainer.out_dir, resolved.name, out)

    def stopped() -> str:
        if (run_dir / COLD_START / HF_CONFIG).is_file():
            return f"stopped after the cold start was saved in {run_dir / COLD_START}"
        return f"stopped before the cold start was saved; rerun with: gspo {_argv()}"

    with _stop_line(stopped), stop_on_signals(0), _writer(run_dir, "gspo sft"):
        from gspo_cli.train.run.loop import run_sft_only

        run_sft_only(resolved, dump_recipe_yaml(resolved), run_dir=run_dir, console=console)


@app.command("eval")
def eval_(
    checkpoint: CheckpointArg,
    benchmark: BenchmarkOpt = None,
    samples: Annotated[int | None, typer.Option(help="Samples per problem (k).")] = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    max_new_tokens: MaxNewTokensOpt = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N problems.")] = None,
    data: EvalDataOpt = None,
    start: Annotated[str | None, typer.Option(help="LiveCodeBench: first contest date.")] = None,
    end: Annotated[str | None, typer.Option(help="LiveCodeBench: last contest date.")] = None,
    standings: StandingsOpt = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    engine: EvalEngineOpt = None,
    out: EvalOutOpt = None,
    resume: EvalResumeOpt = False,
    recipe: EvalRecipeOpt = None,
    prompt_template: PromptTemplateOpt = None,
    steps: StepsOpt = None,
    set_: SetOpt = None,
) -> None:
    """Evaluate a checkpoint on a benchmark: avg@k, pass@k, maj@k, Elo, with intervals; with
    --recipe and no benchmark, on each of the recipe's environments' held-out sets; with a run
    folder and --steps, each of its checkpoints, as one curve."""
    from gspo_cli.eval.runner import run_eval
    from gspo_cli.sandbox.isolation import allow_weak_isolation

    resolved = load_recipe(recipe, set_) if recipe else recipe_from_overrides(set_)
    if recipe and benchmark is None and resolved.eval.benchmark is None:
        _evaluate_environments(checkpoint, resolved, engine, out)
        return
    flags = {
        "benchmark": benchmark,
        "samples": samples,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "limit": limit,
        "data": data,
        "start": start,
        "end": end,
        "standings": standings,
        "seed": seed,
    }
    from gspo_cli.eval.settings import eval_settings

    settings = eval_settings(checkpoint, flags, engine, prompt_template, recipe, resolved)
    allow_weak_isolation(resolved.reward.sandbox.allow_weak_isolation)
    curve = Path(checkpoint) / EVAL_DIR / f"{settings.benchmark}-curve"
    folder = out or (curve if steps else Path("evals") / settings.benchmark)
    with _stop_line(lambda: eval_stop_message(folder, sys.argv[1:])), stop_on_signals(0):
        if steps:
            from gspo_cli.eval.curve import evaluate_curve

            evaluate_curve(Path(checkpoint), steps, settings, folder, console)
            return
        run_eval(settings, folder, resume=resume, console=console)


@app.command()
def export(
    checkpoint: Annotated[
        str, typer.Argument(help="Run folder (its latest checkpoint) or checkpoint folder.")
    ],
    out: Annotated[Path, typer.Argument(help="New (or empty) folder for the HF checkpoint.")],
    best: Annotated[
        bool, typer.Option("--best", help="The run's best checkpoint by trainer.best_metric.")
    ] = False,
) -> None:
    """Write a plain HF checkpoint that transformers loads alone (LoRA adapters merged in)."""
    from gspo_cli.eval.export import export_checkpoint

    source = export_checkpoint(checkpoint, out, best)
    console.print(f"exported {source} -> {out}", highlight=False)


@app.command()
def compare(
    runs: Annotated[list[Path], typer.Argument(help="Run folders to compare.", show_default=False)],
    metrics: Annotated[str | None, typer.Option(help="Comma-separated metrics to show.")] = None,
    x: Annotated[str, typer.Option(help="x axis: step, tokens or time.")] = "step",
    smooth: Annotated[int, typer.Option(help="Trailing moving-average window, in steps.")] = 1,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default comparisons/latest).")
    ] = None,
    baseline: Annotated[Path | None, typer.Option(help="Run the others are compared to.")] = None,
    group_seeds: Annotated[
        bool,
        typer.Option(
            "--group-seeds",
            help="One column per recipe: runs whose recipe.yaml differ only in trainer.seed, "
            "as mean ± 95% t interval over the seeds.",
        ),
    ] = False,
) -> None:
    """Compare runs side by side: table, stability verdicts, PNG plots, summary.md/json."""
    from gspo_cli.compare import compare_runs

    code = compare_runs(
        list(runs),
        metrics=metrics.split(",") if metrics else None,
        x=x,
        smooth=smooth,
        out=out,
        baseline=baseline,
        group_seeds=group_seeds,
        console=console,
    )
    raise typer.Exit(code)


@app.command()
def watch(
    run: Annotated[Path, typer.Argument(help="Run folder.", show_default=False)],
    once: Annotated[bool, typer.Option("--once", help="Print one screen and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 2.0,
) -> None:
    """A live view of a run folder: the last steps' metrics, held-out, the guard, samples."""
    from gspo_cli.runs.watch_view import watch_run

    watch_run(run, console, once=once, interval=interval)


def _evaluate_environments(
    checkpoint: str, resolved: Recipe, engine: str | None, out: Path | None
) -> None:
    """`gspo eval --recipe` with no benchmark: the recipe's environments, each on its held-out
    set, as training evaluates them."""
    from gspo_cli.train.run.environment_eval import evaluate_environments

    folder = out or Path("evals") / "heldout"
    with _stop_line(lambda: eval_stop_message(folder, sys.argv[1:])), stop_on_signals(0):
        evaluate_environments(checkpoint, resolved, engine, folder, console)


def _before_the_folder(resolved: Recipe, nproc: int, hostfile: Path | None) -> None:
    """A bad hostfile is refused before the run folder is made (it leaves nothing behind); the
    run's summary line is printed once (not again in each rank that --nproc starts)."""
    if hostfile is not None:
        from gspo_cli.train.engines.multinode import read_hostfile

        read_hostfile(hostfile, nproc)
    from gspo_cli.train.engines.launch import says_summary

    if says_summary():
        console.print(Text.assemble(("gspo train", "bold"), f" {summary_line(resolved)}"))


def _check_resumed_files(resolved: Recipe, run_dir: Path) -> None:
    """A resumed run's LoRA base and teacher are the files it started with (one line if not)."""
    if resolved.model.lora.r:
        from gspo_cli.train.run.resume import check_resumed_base

        check_resumed_base(resolved, run_dir)  # before the target check converts the file
    if resolved.algorithm.distill is not None:
        from gspo_cli.train.run.teacher import check_resumed_teacher

        check_resumed_teacher(resolved, run_dir)


def _writer(run_dir: Path, command: str, resume: bool = False) -> AbstractContextManager[None]:
    """The run folder's checks, marker and one-writer lock (run_marker.owned_folder). The ranks
    a launcher started (--nproc) leave it to the launching `gspo train`, which holds it for all."""
    from gspo_cli.runs.marker import RUN, owned_folder

    if "LOCAL_RANK" in os.environ:
        return nullcontext()
    return owned_folder(run_dir, command, RUN, resume)


def _argv() -> str:
    import shlex

    return shlex.join(sys.argv[1:])


@contextmanager
def _stop_line(message: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C (exit 130) and SIGTERM (exit 143) end a command with one line, `message()`, which
    says where it stopped and how to go on; never a traceback. Processes that a launcher
    started leave the line to the launching `gspo train`."""
    try:
        yield
    except (KeyboardInterrupt, Stopped) as exc:
        code = exc.exit_code if isinstance(exc, Stopped) else INTERRUPT_EXIT
        if "LOCAL_RANK" not in os.environ:
            err_console.print(message(), highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(code) from None


def main() -> None:
    """Console-script entry: user errors become one line per problem and exit code 2."""
    quiet_libraries()
    try:
        app()  # Typer/click handle usage errors themselves (exit 2).
    except RecipeError as exc:
        for problem in exc.problems:
            _error(f"{exc.source}: {problem}")
        sys.exit(2)
    except (GspoError, UnknownNameError) as exc:  # unknown names come from user input too
        _error(str(exc))
        sys.exit(2)
    except KeyboardInterrupt:  # outside a command's own stop line (e.g. during start-up)
        sys.exit(INTERRUPT_EXIT)
    except OSError as exc:  # a disk or folder the user must fix, wherever the write was
        if exc.errno not in USER_ERRNOS or exc.filename is None:
            raise
        _error(str(write_error(exc, Path(exc.filename))))
        sys.exit(2)


# Write errors that are the machine's state, not a bug: full, quota, size limit, read-only, refused.
USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


def _error(line: str) -> None:
    err_console.print(Text.assemble(("error:", "red"), f" {line}"), soft_wrap=True)


if __name__ == "__main__":
    main()
