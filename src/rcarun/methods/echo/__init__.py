"""ECHO (Banerjee et al., 2025): hierarchical context per target, independent analysts, a weighted vote.

Each part is a module tested on its own: `context` (the hierarchical levels, cue extraction and fitting; no
LLM), `targets` (the per-target contexts the analysts read; no LLM), `answers` (the answer schema and its strict
reading), `vote` (the consensus vote, the decoupled pairing and the fallback; pure functions) and `method` (the
options, the panel and the `Echo` method registered as ``"echo"``). The design is in ``docs/methods/echo.md``.
Importing this package registers the method.
"""

from rcarun.methods.echo.answers import (
    CONCLUSION_TYPES,
    AnswerReading,
    Conclusion,
    Evaluation,
    answer_schema,
    read_answer,
)
from rcarun.methods.echo.context import (
    CONTEXT_TYPES,
    LEVEL_WORDS,
    ContextLine,
    ContextView,
    Extract,
    build_context,
    choose_focal_steps,
    context_level,
    context_lines,
    extract_cue,
    fit_context,
    hierarchical_context,
    key_decision,
    milestone,
    outcome_summary,
    split_sentences,
    spread_steps,
)
from rcarun.methods.echo.method import PERSONAS, AnalystSpec, Echo, EchoOptions, PanelView, analyst_panel
from rcarun.methods.echo.targets import TargetContext, target_context
from rcarun.methods.echo.vote import Vote, VoteOutcome, consensus_vote, pair_conclusion

__all__ = [
    "CONCLUSION_TYPES",
    "CONTEXT_TYPES",
    "LEVEL_WORDS",
    "PERSONAS",
    "AnalystSpec",
    "AnswerReading",
    "Conclusion",
    "ContextLine",
    "ContextView",
    "Echo",
    "EchoOptions",
    "Evaluation",
    "Extract",
    "PanelView",
    "TargetContext",
    "Vote",
    "VoteOutcome",
    "analyst_panel",
    "answer_schema",
    "build_context",
    "choose_focal_steps",
    "consensus_vote",
    "context_level",
    "context_lines",
    "extract_cue",
    "fit_context",
    "hierarchical_context",
    "key_decision",
    "milestone",
    "outcome_summary",
    "pair_conclusion",
    "read_answer",
    "split_sentences",
    "spread_steps",
    "target_context",
]
