"""`gspo eval`: sample k responses per problem, judge them (eval/generation.py), and report
metrics with intervals.

The run is resumable: each finished problem is appended to `samples.jsonl` (fsynced) and a rerun
with `resume=True` skips it. `results.json` is written atomically at the end. The output folder
has one writer at a time (runs/lock.py); progress goes to stderr (eval/progress.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.data.benchmarks import build_prompt, load_benchmark
from gspo_cli.data.problems import Problem
from gspo_cli.data.prompts import IDENTITY, PromptFormat, PromptSettings, template_kwargs
from gspo_cli.eval.checkpoints import load_for_eval
from gspo_cli.eval.codeelo import load_standings_cache
from gspo_cli.eval.generation import generate_and_judge
from gspo_cli.eval.progress import EvalProgress
from gspo_cli.eval.summary import codeforces_elo, summarize
from gspo_cli.models.loading import convert_first
from gspo_cli.models.run_checkpoints import resolve_checkpoint
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import EngineSpec, RolloutEngine, SamplingParams
from gspo_cli.rollout.engines import make_rollout_engine
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.rollout.tools.build import tool_schemas_for
from gspo_cli.runs.folder import (
    RESULTS,
    SAMPLES,
    SETTINGS,
    append_jsonl,
    read_jsonl,
    write_error,
    write_text_atomic,
)
from gspo_cli.runs.marker import EVAL, owned_folder

# Builds the rollout engine from the loaded policy; another backend (or a scripted one) plugs in
EngineFactory = Callable[[PreTrainedModel, PreTrainedTokenizerBase], RolloutEngine]


@dataclass(frozen=True)
class EvalSettings:
    checkpoint: str
    benchmark: str
    samples: int = 4
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 1024
    limit: int | None = None
    data: str | None = None
    start: str | None = None
    end: str | None = None
    standings: str | None = None
    seed: int = 0
    verifier_workers: int = 2
    verifier_timeout_s: float = 5.0
    engine: str = "hf"  # a registered rollout engine (hf, vllm)
    # Wraps each bare question ({prompt}) in place of the benchmark's instruction: a model's
    # own task asks in its training recipe's words (data.prompt_template). None: the benchmark's.
    prompt_template: str | None = None
    # The recipe's data.system_prompt (for its own task, as the template), data.chat_template and
    # data.chat_template_kwargs: how the model is talked to (data/prompts.py).
    system_prompt: str | None = None
    chat_template: str = "auto"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: ToolSettings | None = None  # the recipe's rollout.tools: the model answers with them

    @property
    def prompt_format(self) -> PromptSettings:
        """How `prompt_builder`'s question is asked: `prompt_template` (when set) wraps it, or a
        conversation's last user turn, as in training (data/prompts.py)."""
        return PromptFormat(
            prompt_template=IDENTITY if self.prompt_template is None else self.prompt_template,
            system_prompt=self.system_prompt,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
        )


# Settings added after evaluations were first recorded: left out of settings.json at these
# values, so that those evaluations still resume.
LATER_SETTINGS: dict[str, Any] = {
    "prompt_template": None,
    "system_prompt": None,
    "chat_template": "auto",
    "chat_template_kwargs": {},
}


def run_eval(
    settings: EvalSettings,
    out: Path,
    *,
    resume: bool = False,
    console: Console,
    engine_factory: EngineFactory | None = None,
) -> dict[str, Any]:
    model_path = resolve_checkpoint(settings.checkpoint)  # cheap checks first
    problems = load_benchmark(
        settings.benchmark,
        settings.data,
        start=settings.start,
        end=settings.end,
        limit=settings.limit,
    )
    if settings.standings:  # read it now: a bad cache must not waste the generation
        try:
            load_standings_cache(settings.standings)
        except ValueError as exc:
            raise GspoError(f"--standings: {exc}") from None
    # a GGUF (or a LoRA checkpoint's GGUF base) converts or fails before `out` is touched
    convert_first(model_path, what="checkpoint")
    if resume and not (out.is_dir() and any(out.iterdir())):  # a mistyped --out: not afresh
        raise GspoError(
            f"--resume: {out} holds no evaluation (it is empty or missing); run without "
            "--resume to start one"
        )
    with owned_folder(out, "gspo eval", EVAL):  # never among a user's own files
        done = _prepare_out(out, settings, resume)
        records = _sample_and_judge(
            settings, model_path, problems, done, out, console, engine_factory
        )
        results = _results(settings, model_path, problems, records)
        write_text_atomic(out / RESULTS, json.dumps(results, indent=2))
    print_results(results, console)
    console.print(f"results: {out / RESULTS} (per problem: {out / SAMPLES})", highlight=False)
    return results


def _sample_and_judge(
    settings: EvalSettings,
    model_path: str,
    problems: list[Problem],
    done: dict[str, dict[str, Any]],
    out: Path,
    console: Console,
    engine_factory: EngineFactory | None,
) -> list[dict[str, Any]]:
    """Every problem's record, in order: those in `done` as they are, the others sampled,
    judged and appended to samples.jsonl one by one."""
    model, tokenizer = load_for_eval(model_path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    engine = (engine_factory or _registered_engine(settings))(model, tokenizer)
    params = SamplingParams(
        settings.temperature, settings.top_p, 0, settings.max_new_tokens, settings.samples
    )
    template = "" if settings.prompt_template is None else f", prompt {settings.prompt_template!r}"
    console.print(
        f"{settings.benchmark}: {len(problems)} problems x {settings.samples} samples "
        f"({len(done)} already done), T={settings.temperature}, top-p={settings.top_p}, "
        f"seed {settings.seed}, model {model_path}{template}",
        highlight=False,
    )
    with EvalProgress(len(problems), len(done)) as progress:

        def finished(record: dict[str, Any]) -> None:
            append_jsonl(out / SAMPLES, record)
            done[record["id"]] = record
            progress.advance()

        try:
            with MathVerifierPool(settings.verifier_workers, settings.verifier_timeout_s) as pool:
                generate_and_judge(
                    engine,
                    tokenizer,
                    problems,
                    params,
                    settings.seed,
                    math_pool=pool,
                    prompt_for=prompt_builder(settings.prompt_template),
                    prompt_format=settings.prompt_format,
                    on_done=finished,
                    skip=set(done),
                    tools=None if settings.tools is None else tool_schemas_for(settings.tools),
                )
        finally:
            engine.close()
    return [done[p.id] for p in problems]


def prompt_builder(template: str | None) -> Callable[[Problem], str]:
    """The benchmark's own prompt (None), or the bare question, which `template` then wraps
    through `EvalSettings.prompt_format` (as training wraps it, conversations included)."""
    if template is None:
        return build_prompt
    return lambda problem: problem.question


def _registered_engine(settings: EvalSettings) -> EngineFactory:
    def build(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> RolloutEngine:
        spec = EngineSpec(
            model,
            tokenizer,
            model.state_dict().items,
            seed=settings.seed,
            tools=settings.tools,
            model_name=settings.checkpoint,
            chat_template_kwargs=template_kwargs(settings),
        )
        return make_rollout_engine(settings.engine, spec)

    return build


def _prepare_out(out: Path, settings: EvalSettings, resume: bool) -> dict[str, dict[str, Any]]:
    """Finished problems by id (resume), after checking the settings match the earlier run.

    A folder with settings but no finished problem (a failed start) is not an evaluation yet:
    it never blocks a rerun."""
    settings_file = out / SETTINGS
    recorded = {
        key: value
        for key, value in asdict(settings).items()
        if key not in LATER_SETTINGS or value != LATER_SETTINGS[key]
    }
    wanted = json.dumps(recorded, indent=2, sort_keys=True)
    started = bool(read_jsonl(out / SAMPLES)) or (out / RESULTS).is_file()
    if started and settings_file.is_file():
        if not resume:
            raise GspoError(f"{out} already holds an evaluation: pass --resume, or another --out")
        if settings_file.read_text(encoding="utf-8") != wanted:
            raise GspoError(f"--resume: the settings differ from the ones in {settings_file}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(settings_file, wanted)
    except OSError as exc:
        raise write_error(exc, out) from None
    done: dict[str, dict[str, Any]] = {}
    # A line a kill cut short is skipped by read_jsonl: that problem runs again.
    for record in read_jsonl(out / SAMPLES) if resume and started else []:
        if "id" in record:
            done[record["id"]] = record
    return done


def _results(
    settings: EvalSettings, model_path: str, problems: list[Problem], records: list[dict[str, Any]]
) -> dict[str, Any]:
    kind = problems[0].kind
    metrics = summarize(records, settings.samples, kind, settings.seed)
    results: dict[str, Any] = {
        "benchmark": settings.benchmark,
        "checkpoint": model_path,
        "problems": len(problems),
        "sampling": {
            "samples": settings.samples,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_new_tokens": settings.max_new_tokens,
        },
        "seed": settings.seed,
        **{
            key: getattr(settings, key)
            for key, default in LATER_SETTINGS.items()
            if getattr(settings, key) != default
        },
        "interval": "95% percentile bootstrap over problems (1000 resamples)",
        "metrics": metrics,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if settings.benchmark == "codeforces":
        results["elo"] = codeforces_elo(
            records, settings.samples, settings.standings, settings.seed
        )
    return results


def print_results(results: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"{results['benchmark']} ({results['problems']} problems) - {results['checkpoint']}"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% interval", justify="right")
    for name, value in results["metrics"].items():
        if isinstance(value, dict):
            ci = (
                ""
                if value["ci_low"] is None
                else f"[{value['ci_low']:.3f}, {value['ci_high']:.3f}]"
            )
            table.add_row(name, f"{value['value']:.3f}", ci)
        elif value is not None:
            table.add_row(name, f"{value:.3f}", "")
    if "elo" in results:
        elo = results["elo"]
        shown = "n/a" if elo.get("value") is None else f"{elo['value']:.0f}"
        table.add_row(f"elo ({elo['method']})", shown, "")
    console.print(table)
