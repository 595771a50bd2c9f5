"""Load a recipe: YAML file (+ its `base:` chain) + `--set` overrides -> a validated Recipe.

Precedence: schema defaults < base recipe(s) < the recipe < `--set` overrides.
Every problem becomes one line naming the key path; `RecipeError` carries them all.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gspo_cli.core.errors import GspoError
from gspo_cli.data.sources import BENCHMARK_PREFIX, split_benchmark_source
from gspo_cli.recipe.bounds import size_problems, warn_memory
from gspo_cli.recipe.schema import Recipe
from gspo_cli.recipe.section import looks_local
from gspo_cli.runs.marker import is_run_folder

BASE_KEY = "base"


class RecipeYamlLoader(yaml.SafeLoader):
    """YAML with YAML 1.2's booleans: only true/false. Under PyYAML's 1.1 rules `off`, `on`,
    `yes` and `no` are booleans, and `routing_replay: off` would read as False."""


RecipeYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
RecipeYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def read_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=RecipeYamlLoader)


class RecipeError(GspoError):
    """One or more problems in a recipe; `problems` holds one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, merge and validate a recipe file; raise `RecipeError` on any problem."""
    raw = load_recipe_dict(path)
    for override in overrides or []:
        apply_override(raw, override, str(path))
    _teacher_run_to_checkpoint(raw, str(path))
    recipe = validate_recipe(raw, str(path))
    warn_memory(recipe)  # before anything is loaded: one line, not an error
    return recipe


def load_recipe_dict(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The recipe as a plain dict with its `base:` chain merged in (not yet validated)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise RecipeError(str(path), ["file not found"])
    resolved = file.resolve()
    if resolved in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, resolved))
        raise RecipeError(str(path), [f"{BASE_KEY}: recipes extend each other in a loop: {chain}"])
    data = _resolve_paths(_read_yaml(file), file.parent)
    base = data.pop(BASE_KEY, None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise RecipeError(str(path), [f"{BASE_KEY}: must be a path to another recipe"])
    base_file = (file.parent / base) if not Path(base).is_absolute() else Path(base)
    if not base_file.is_file():
        raise RecipeError(str(path), [f"{BASE_KEY}: file not found: {base}"])
    return deep_merge(load_recipe_dict(base_file, (*_seen, resolved)), data)


def _read_yaml(file: Path) -> dict[str, Any]:
    try:
        data = read_yaml_text(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(str(file), [f"{where}invalid YAML: {problem}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(str(file), [f"cannot read: {exc}"]) from None
    if data is None:
        raise RecipeError(str(file), ["the recipe file is empty (write at least `name: ...`)"])
    if not isinstance(data, dict):
        raise RecipeError(str(file), ["a recipe must be a mapping of sections"])
    return data


# Keys holding file paths. In a recipe file a relative path is relative to that file, as `base:`
# is; on the command line (`--set`) it stays relative to the working directory.
PATH_KEYS = (
    ("model", "path"),
    ("data", "source"),
    ("data", "eval_source"),
    ("eval", "data"),
    ("eval", "standings"),
    ("deepspeed", "config_file"),
)


def _resolve_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`data` with each relative local path under PATH_KEYS made absolute against `folder`."""
    for section, key in PATH_KEYS:
        node = data.get(section)
        if isinstance(node, dict) and isinstance(node.get(key), str):
            node[key] = resolve_path(node[key], folder)
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("path"), str):
        model["path"] = resolve_model_folder(model["path"], folder)
    for entry in data.get("environments") or []:  # each environment's own data files
        own = entry.get("data") if isinstance(entry, dict) else None
        for key in ("source", "eval_source"):
            if isinstance(own, dict) and isinstance(own.get(key), str):
                own[key] = resolve_path(own[key], folder)
    _resolve_reward_models(data, folder)
    algorithm = data.get("algorithm")  # the distillation teacher: a model path one level down
    distill = algorithm.get("distill") if isinstance(algorithm, dict) else None
    if isinstance(distill, dict) and isinstance(distill.get("teacher"), str):
        distill["teacher"] = resolve_model_path(distill["teacher"], folder)
    return data


def _teacher_run_to_checkpoint(data: dict[str, Any], source: str) -> None:
    """A distillation teacher named by its run folder becomes the run's latest checkpoint
    (a LoRA run's adapters, merged into their base when loaded), as `gspo eval RUN` takes it;
    the saved recipe names that checkpoint, so a resume uses the same teacher."""
    algorithm = data.get("algorithm")
    distill = algorithm.get("distill") if isinstance(algorithm, dict) else None
    teacher = distill.get("teacher") if isinstance(distill, dict) else None
    if not isinstance(teacher, str) or not is_run_folder(Path(teacher).expanduser()):
        return
    from gspo_cli.models.run_checkpoints import resolve_checkpoint  # loads transformers

    try:
        distill["teacher"] = resolve_checkpoint(teacher)  # type: ignore[index]
    except GspoError as exc:
        raise RecipeError(source, [f"algorithm.distill.teacher: {exc}"]) from None


# Rewards whose `model` option may name a checkpoint folder (the judge's may also be a URL).
MODEL_OPTION_REWARDS = ("reward_model", "judge")


def _resolve_reward_models(data: dict[str, Any], folder: Path) -> None:
    """The `model` option of each reward in MODEL_OPTION_REWARDS (the recipe's and each
    environment's) and of the held-out judge, made absolute against `folder`."""
    found = data.get("reward")
    reward: dict[str, Any] = found if isinstance(found, dict) else {}
    function_lists = [reward.get("functions")] + [
        entry.get("reward") for entry in data.get("environments") or [] if isinstance(entry, dict)
    ]
    for functions in function_lists:
        for function in functions if isinstance(functions, list) else []:
            if isinstance(function, dict) and function.get("name") in MODEL_OPTION_REWARDS:
                _resolve_model_option(function.get("options"), folder)
    heldout_judge = reward.get("heldout_judge")
    if isinstance(heldout_judge, dict):
        _resolve_model_option(heldout_judge.get("options"), folder)


def _resolve_model_option(options: object, folder: Path) -> None:
    """A reward's `options.model`, a folder relative to the recipe as `model.path` is."""
    if isinstance(options, dict) and isinstance(options.get("model"), str):
        options["model"] = resolve_model_path(options["model"], folder)


def resolve_model_path(value: str, folder: Path) -> str:
    """A model named in a recipe: a relative path, or a bare name with a folder next to the
    recipe, made absolute; anything else (hub ids, built-ins, URLs) as it is."""
    return resolve_model_folder(resolve_path(value, folder), folder)


def resolve_model_folder(value: str, folder: Path) -> str:
    """A bare `model.path` ("mymodel", "org/name") names a folder next to the recipe when one
    exists there, as HF's from_pretrained prefers a folder to a hub id; else it is a hub id."""
    if not value or looks_local(value) or not (folder / value).is_dir():
        return value
    return str((folder / value).resolve())


def resolve_path(value: str, folder: Path) -> str:
    """A local relative path ("./x", "../x", "x.jsonl", or benchmark:NAME:PATH) made absolute;
    hub ids, built-ins, absolute and home paths are returned as they are."""
    benchmark = split_benchmark_source(value)
    if benchmark is not None:
        name, local = benchmark
        return value if local is None else f"{BENCHMARK_PREFIX}{name}:{resolve_path(local, folder)}"
    if not looks_local(value) or value.startswith("~") or Path(value).is_absolute():
        return value
    return str((folder / value).resolve())


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge key by key: nested mappings merge, anything else in `override` replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_override(raw: dict[str, Any], override: str, source: str) -> None:
    """Apply one `key.path=value` override in place; the value is parsed as YAML. A mapping
    merges key by key into the section it names, as `base:` does; a number indexes a list
    (`reward.functions.0.weight=2`)."""
    key_path, sep, text = override.partition("=")
    keys = key_path.strip().split(".")
    if not sep or not all(keys):
        raise RecipeError(source, [f"--set {override!r}: expected KEY.PATH=VALUE"])
    try:
        value = read_yaml_text(text)
    except yaml.YAMLError:
        value = text
    try:
        node: Any = raw
        for depth in range(len(keys) - 1):
            node = _child(node, keys, depth)
        _assign(node, keys, value)
    except ValueError as exc:
        raise RecipeError(source, [f"--set {override!r}: {exc}"]) from None


def _child(node: Any, keys: list[str], depth: int) -> Any:
    """The section or list item at keys[depth] under `node`, created when it is missing: a
    list as the schema's default list (so that an index overrides one item), a section as {}."""
    key, where = keys[depth], ".".join(keys[: depth + 1])
    if isinstance(node, list):
        child = node[_index(node, keys, depth)]
    elif key not in node or node[key] is None:
        child = _default_list(keys[: depth + 1])
        if child is None and keys[depth + 1].isdigit():
            raise ValueError(f"{where} is not a list")
        node[key] = child = {} if child is None else child
    else:
        child = node[key]
    if not isinstance(child, dict | list):
        raise ValueError(f"{where} is not a section")
    return child


def _assign(node: Any, keys: list[str], value: Any) -> None:
    """Set the last key; a mapping merges into the mapping already there."""
    if isinstance(node, list):
        index = _index(node, keys, len(keys) - 1)
        node[index] = _merged(node[index], value)
    else:
        node[keys[-1]] = _merged(node.get(keys[-1]), value)


def _merged(old: Any, value: Any) -> Any:
    return deep_merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value


def _index(items: list[Any], keys: list[str], depth: int) -> int:
    where, key = ".".join(keys[:depth]), keys[depth]
    example = f"{where}=[{{...}}, {{...}}]"
    if not key.isdigit():
        raise ValueError(
            f"{where} is a list: index it by number ({where}.0...), or write it whole: {example}"
        )
    if int(key) >= len(items):
        raise ValueError(
            f"{where} has {len(items)} item(s), so index {key} is out of range; to add one, write "
            f"the whole list: {example}"
        )
    return int(key)


def _default_list(keys: list[str]) -> list[Any] | None:
    """A copy of the schema's default for the list field at `keys`; None when the schema has
    no list there."""
    model: type[BaseModel] = Recipe
    for key in keys[:-1]:
        field = model.model_fields.get(key)
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    field = model.model_fields.get(keys[-1])
    default = field.get_default(call_default_factory=True) if field else None
    if not isinstance(default, list):
        return None
    return [item.model_dump() if isinstance(item, BaseModel) else item for item in default]


def validate_recipe(raw: dict[str, Any], source: str) -> Recipe:
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(source, [describe_error(err) for err in exc.errors()]) from None
    problems = size_problems(recipe)  # sizes need the whole, valid recipe
    if problems:
        raise RecipeError(source, problems)
    return recipe


def recipe_from_overrides(overrides: list[str] | None) -> Recipe:
    """Defaults and `--set KEY=VALUE` overrides (eval.*, reward.num_workers...), no recipe file."""
    raw: dict[str, Any] = {}
    for override in overrides or []:
        apply_override(raw, override, "--set")
    return validate_recipe(raw, "--set")


def describe_error(err: Any) -> str:
    loc = [str(part) for part in err["loc"]]
    where = ".".join(loc) or "recipe"
    if err["type"] == "extra_forbidden":
        hint = _closest_field(loc)
        return f"{where}: unknown key{hint}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] not in ("missing", "value_error") and not isinstance(err.get("input"), dict):
        return f"{where}: {message} (got {err['input']!r})"
    return f"{where}: {message}"


def _closest_field(loc: list[str]) -> str:
    """ "; did you mean 'x'?" for an unknown key, found among the fields of its section."""
    model: type[BaseModel] | None = Recipe
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field else None
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    if model is None:
        return ""
    match = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.5)
    return (
        f"; did you mean '{match[0]}'?"
        if match
        else f"; valid keys: {', '.join(model.model_fields)}"
    )


def dump_recipe_yaml(recipe: Recipe) -> str:
    """The resolved recipe as the run folder stores it (every key, in schema order)."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
