"""Data: built-in synthetic tasks, local or hub data sets, prompt rendering."""

from gspo_cli.data.arithmetic import arithmetic_split, make_problem
from gspo_cli.data.prompts import load_rows, render_prompt

__all__ = ["arithmetic_split", "load_rows", "make_problem", "render_prompt"]
