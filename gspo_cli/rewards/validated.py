"""Option types that check themselves when a recipe loads.

A reward's keyword-only option annotated with a `str` subclass whose pydantic schema comes from
`checked_str_schema` runs the check in `binding.check_options`, so a bad value is one line at
validate time. A subclass, not `Annotated[str, ...]`: `typing.get_type_hints` drops `Annotated`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema


def checked_str_schema(check: Callable[[str], str]) -> core_schema.CoreSchema:
    """A string schema whose values pass `check` (which raises ValueError with the one line)."""
    return core_schema.no_info_after_validator_function(check, core_schema.str_schema())


class AtLeastOne(int):
    """An int option of 1 or more (a size, a count), checked when the recipe loads."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.int_schema(ge=1)


class Positive(float):
    """A float option above 0 (seconds), checked when the recipe loads."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.float_schema(gt=0, allow_inf_nan=False)
