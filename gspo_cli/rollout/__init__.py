"""Rollout engines behind one Protocol, chosen by name (`rollout.engine`): hf, vllm.

Import from the modules (`rollout.base`, `rollout.batch`, `rollout.engines`): this package's
top level imports nothing, so that the recipe can read `rollout.tool_settings` without torch,
and the engines load only when chosen.
"""
