"""Recipes: the pydantic schema, YAML loading with `base:` inheritance, `--set` overrides."""

from gspo_cli.recipe.loader import (
    RecipeError,
    apply_override,
    deep_merge,
    dump_recipe_yaml,
    load_recipe,
)
from gspo_cli.recipe.schema import Recipe

__all__ = [
    "Recipe",
    "RecipeError",
    "apply_override",
    "deep_merge",
    "dump_recipe_yaml",
    "load_recipe",
]
