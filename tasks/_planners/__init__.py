"""Producers for the accept gate: surrogate, OpenAI-compatible model, recorded transcript."""

from tasks._planners._completion import parse_completion, reask_messages
from tasks._planners._llm import LLMPlanner
from tasks._planners._scripted import ScriptedPlanner
from tasks._planners._surrogate_planner import SurrogatePlanner

__all__ = [
    "LLMPlanner",
    "ScriptedPlanner",
    "SurrogatePlanner",
    "parse_completion",
    "reask_messages",
]
