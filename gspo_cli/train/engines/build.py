"""Building the training engine `trainer.engine` names (core/engine_catalogue.py lists them), from
plain settings: an engine never sees the recipe."""

from __future__ import annotations

from transformers import PreTrainedModel

from gspo_cli.core.engine_catalogue import TRAIN_ENGINES, multi_process_engines
from gspo_cli.core.errors import GspoError
from gspo_cli.train.engines.distributed import DistContext
from gspo_cli.train.engines.settings import EngineSettings
from gspo_cli.train.engines.torch_engine import TrainEngine


def check_processes(name: str, world: int) -> None:
    """One line, exit 2, when `world` processes are asked of an engine that runs in one."""
    if world > 1 and not TRAIN_ENGINES.get(name).several_processes:
        raise GspoError(f"several processes need trainer.engine: {multi_process_engines()}")


def make_engine(
    name: str, model: PreTrainedModel, settings: EngineSettings, ctx: DistContext
) -> TrainEngine:
    engine: TrainEngine = TRAIN_ENGINES.get(name).load()(model, settings, ctx)
    return engine
