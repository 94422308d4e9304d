"""ECHO: hierarchical context, a panel of independent analysts, a confidence-weighted vote (Banerjee et al., 2025).

ECHO replaces the single judge of the Who&When baselines with three parts, implemented as described in the
baseline notes (``baselines.md``, "ECHO") under the LongRCA protocol (paper Sec. 5.1): every analyst answers a JSON
object whose schema carries the recorded agents as an enum and the step range as integer bounds; the final answer
has an explicit responsible role and a 0-based root step, scored independently; no ground-truth final answer is
shown unless ``include_ground_truth=True``; invalid fields are stored as invalid and never repaired.

1. **Hierarchical context, deterministic (no LLM).** Around a focal step i: L1 = steps i±1 (and i) in full; L2 =
   i±2..3 reduced to a key decision or reasoning sentence (≤50 words); L3 = i±4..6 reduced to a short outcome
   (≤20 words); L4 = everything further away, reduced to a milestone (≤15 words). A reduction is the first
   sentence that matches the level's cue patterns ("Therefore/Thus ...", "The answer is ...", "I conclude ...",
   "completed/created ...", error and warning cues), cut to the level's word cap. Fallback when no sentence of the
   step matches: its first non-empty sentence, cut the same way (recorded as ``cue_matched=False``). The three
   context types of the paper are alternative cue sets (``context_type``: ``decision-quality`` (default),
   ``handoff``, ``error-propagation``). Sentences are split at ``.``, ``!`` or ``?`` followed by whitespace, and at
   line breaks.
2. **Analysts.** ``analysts`` independent calls (stage ``"analyst"``), each with one of the six personas
   (conservative, liberal, detail-focused, pattern-focused, skeptical, general) and its own temperature.
3. **Consensus voting** (`consensus_vote`, a pure function) over the analysts' primary conclusions.

Choices where the notes are silent (each is documented here and, where cheap, an option):

- **What the analysts see.** The paper builds a context per agent/step; FA4MAS sends the raw step list plus one
  example view around step 1, cut at 12k characters — on LongRCA logs (hundreds of steps, 23k-130k tokens) that
  cut would show only the first few dozen steps. Here every analyst sees ONE view of the whole log: every step
  with its real id, at the level given by its distance to the NEAREST of a few focal steps (a multi-focal
  hierarchical view). Focal steps (``focal``): ``"errors"`` (default) = the earliest ``max_focal`` steps whose
  content carries an error/warning cue (a decisive error often becomes visible a few steps after it was made), topped up
  with evenly spaced steps when fewer match; ``"spread"`` = ``max_focal`` evenly spaced steps; or an explicit list
  of step indices (``[1]`` reproduces FA4MAS's example view; indices outside the log are ignored, and ``"spread"``
  is used when none remains).
- **The task, whole, beside the view.** Every analyst prompt states the task instruction in full (up to
  `rcarun.methods.context.TASK_CHAR_CAP`, `task_text`): the record's ``question``, or on LongRCA records, which
  have none, the instruction the loader derived from the opening step(s) of the history
  (`rcarun.data.derive_task`). The view is unchanged: the task step stays step 0 at the level its distance gives
  it, usually an L4 milestone of 15 words, which alone would cut a constraint such as a budget.
- **Character cap** (``context_chars=100_000``, about 25k tokens, instead of FA4MAS's 12k, for the reason above).
  When the view is longer, it is shrunk in this fixed order until it fits: (a) L1 contents are cut in the middle
  (head and tail kept, the cut marked) to the largest common cap, not below 1,000 characters; (b) reduced lines
  are left out, replaced by ``[steps a-b omitted]``: first L4 lines without a cue, then L4 lines with a cue, then
  L3, then L2, each farthest-from-a-focal-step first (later step first on ties); L1 lines are never left out. When
  the backbone's context window is known and the prompt would not fit beside ``max_tokens``, the cap is lowered
  further. What was applied is recorded in ``output["context"]``.
- **Panel.** ``personas`` unset: a seeded sample of ``analysts`` of the six (``random.Random(seed).sample``,
  ``seed=2026`` as FA4MAS), so at most 6 analysts; set: exactly ``analysts`` names (repeats allowed).
  ``temperatures`` unset: uniform in ``temperature_range`` (0.3, 0.9) from the same generator after the persona
  draw, rounded to 2 decimals. The panel is drawn once per method instance, so every trajectory meets the same
  analysts (resume-safe and independent of processing order). With the default options it is
  conservative@0.83, detail-focused@0.84, general@0.67.
- **Decoupled mode** (``decoupled=True``): each analyst runs twice with the same persona and temperature, once
  agent-focused and once step-focused, with the same answer schema. Its vote takes type and attribution from the
  agent-focused answer and mistake_step from the step-focused answer, with weight min(agent_conf, step_conf);
  when either half is malformed the analyst casts no vote.
- **Calls are sent one after another**, in panel order (agent-focused before step-focused): they are independent
  (no analyst sees another's answer), the order is deterministic, and the runner's concurrency is across
  trajectories. A call that raises (fatal call error, spent budget) fails the item as the runner decides.
- **Malformed answers.** A vote needs a JSON object with every required field: summary (string),
  agent_evaluations (array), alternative_hypotheses (array) and a primary_conclusion whose type is one of the two,
  whose attribution is a non-empty array of recorded agent names, whose mistake_step is an integer inside the log,
  whose confidence is a number in [0, 1] and whose reasoning is a string. Anything else is recorded with its
  problems and casts no vote. Agent evaluations are checked one by one (recorded agent, likelihood in [0, 1],
  step_index inside the log); invalid entries are skipped and recorded. A step (mistake_step, step_index) given
  as a digit string (``"12"``) is read as that integer, by the scorer's rule (`rcarun.data.parse_step`). Valid
  evaluations count for the fallback even when the answer's conclusion is malformed.
- **Vote.** Conclusions with confidence < ``min_confidence`` (0.3) are dropped. The type with the largest sum of
  confidences wins (a tie goes to single_agent, since the final answer is one agent). In the winning group every
  agent named by a vote gets the vote's confidence (an agent named twice in one attribution counts once);
  single_agent attributes the top agent, multi_agent every agent with score ≥ ``min_confidence`` — which is every
  agent named by a surviving vote — ordered by score. Steps get the confidences of the votes naming them, and the
  top-scoring step inside [0, n) is chosen. Ties: agents by recorded order, steps earliest first. The consensus
  confidence is the mean confidence of the winning votes. The final answer is the first attributed agent and the
  chosen step.
- **Fallback** when no vote survives: the agent with the highest mean error_likelihood over all valid
  evaluations (ties by recorded order), and that agent's highest-likelihood evaluated step (ties earliest). With no
  valid evaluation either, the method abstains (no role, no step).
- **Disagreement report.** "requires review" when the surviving conclusions hold more than two types (impossible
  with two types; kept for fidelity) or when the confidence spread (max - min) of the well-formed conclusions,
  before the confidence filter, is above 0.5.
- ``max_tokens=8000`` per call (the attribution budget of the other baselines; the answer is longer than theirs).

Unreadable answers and fallbacks (``Attribution.error`` / ``fallback``), keeping the output's own ``fallback``
record as it is:

- ``error``: no analyst answer could be used at all (every call malformed: not a JSON object, or a conclusion
  that breaks the schema) and no valid agent evaluation either, so the method abstains on no answer of the
  model. It counts the malformed calls and gives the first one's parse error or problems. Some analysts being
  malformed is not an error: the others' votes decide.
- ``fallback``: a rule of the design, not the analysts' votes, decided the answer: the mean-likelihood
  fallback (no vote survived; the text says how many analysts were malformed and how many votes fell below
  ``min_confidence``); an abstention because every well-formed vote fell below ``min_confidence`` and no
  evaluation was valid; or a tie rule that decided the final answer (tied conclusion types go to single_agent,
  tied top agents to recorded order, tied top steps to the earliest).

Output (``Attribution.output``): ``panel``; ``context`` (focal steps, cap, what was cut or left out); ``calls``
(one per call: persona, temperature, focus, the parsed answer or the raw text with its parse error, problems,
skipped evaluations); ``vote_table`` (every vote with its kept flag, the malformed analysts, type sums, the winning
type, ranked agent and step scores); ``consensus`` (type, attribution, mistake_step, confidence and a reasoning
synthesised from the winning votes without a model call; None when no vote was kept); ``agent_mean_likelihood``;
up to 5 ``alternative_hypotheses`` by confidence (reported, never voted); ``disagreement``; ``fallback``;
``n_analysts`` and ``n_calls``.

Cost: ``analysts`` calls per trajectory (3 by default), ``2 * analysts`` in decoupled mode; no per-step calls.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from importlib import resources
from string import Template
from typing import Any, Literal, TypeGuard, get_args

from rcarun.data import Trajectory, parse_step
from rcarun.errors import ConfigError
from rcarun.methods.base import Attribution, Method, is_int, role_is_valid, step_is_valid
from rcarun.methods.context import task_text
from rcarun.methods.llm import LLM, Message, Reasoning
from rcarun.methods.registry import method

__all__ = [
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
]

ContextType = Literal["decision-quality", "handoff", "error-propagation"]
CONTEXT_TYPES: tuple[str, ...] = get_args(ContextType)
PERSONAS: tuple[str, ...] = (
    "conservative",
    "liberal",
    "detail-focused",
    "pattern-focused",
    "skeptical",
    "general",
)
CONCLUSION_TYPES: tuple[str, ...] = ("single_agent", "multi_agent")
LEVEL_WORDS: Mapping[int, int] = {2: 50, 3: 20, 4: 15}
"""Word cap of a reduced step, by level (L1 is shown in full)."""

_CHARS_PER_WORD = 8  # an extract is also cut at 8 characters per allowed word (400/160/120 characters)
_LEVEL_TAGS: Mapping[int, str] = {2: "L2 key decision", 3: "L3 outcome", 4: "L4 milestone"}
_MIN_FULL_CHARS = 1000  # L1 contents are never cut below this when the view must shrink
_MIN_CONTEXT_CHARS = 2000
_CUT = " [... {n} characters cut ...] "
_REVIEW_SPREAD = 0.5
_MAX_ALTERNATIVES = 5
_CONTEXT_MARGIN_TOKENS = 512  # chat-template overhead and estimate error, besides the output budget
_SCORE_DIGITS = 9  # sums of confidences are compared after rounding, so 0.1 + 0.2 ties with 0.3


def _cues(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{alternative})" for alternative in alternatives), re.IGNORECASE)


# Cue sets: context type -> level -> pattern. A sentence matches when the pattern is found anywhere in it.
_CUE_SETS: Mapping[str, Mapping[int, re.Pattern[str]]] = {
    "decision-quality": {
        2: _cues(
            r"\b(?:therefore|thus|hence|consequently)\b",
            r"\bthe (?:final )?answer is\b",
            r"\bI (?:conclude|decide|decided|will|choose|chose|think|believe)\b",
            r"\b(?:we|I) (?:should|need to|must)\b",
            r"\blet(?:'s| me| us)\b",
            r"\b(?:in conclusion|final answer|my plan|the plan is|next step)\b",
        ),
        3: _cues(
            r"\bthe (?:final )?answer is\b",
            r"\b(?:result(?:s|ed)?|returned|found|output|shows?|verified|confirmed)\b",
            r"\b(?:assum\w*|warning|error|fail\w*|success\w*)\b",
            r"\b(?:completed|created)\b",
        ),
        4: _cues(
            r"\b(?:completed|created|finished|saved|submitted|solved|succeeded|failed)\b",
            r"\b(?:final answer|the answer is|I conclude)\b",
            r"\bTERMINATE\b",
        ),
    },
    "handoff": {
        2: _cues(
            r"\bplease\b",
            r"\byou (?:should|need to|must|will)\b",
            r"\byour (?:task|job|next)\b",
            r"\bhand(?:ing|ed)? (?:it )?(?:off|over)\b",
            r"\b(?:delegat\w*|assign\w*|instruct\w*|request\w*)\b",
            r"\bask(?:ing)? \w+ to\b",
            r"->",
        ),
        3: _cues(
            r"\b(?:received|report\w*|here is|here are|returned|result\w*|done|completed)\b",
            r"\b(?:assum\w*|warning)\b",
        ),
        4: _cues(
            r"\bhand(?:ing|ed)? (?:it )?(?:off|over)\b",
            r"\b(?:delegat\w*|assign\w*|completed|finished)\b",
            r"\b(?:final answer|TERMINATE)\b",
            r"->",
        ),
    },
    "error-propagation": {
        2: _cues(
            r"\b(?:error|exception|traceback|fail\w*|incorrect|wrong|mistake|invalid|missing|warning)\b",
            r"\bnot found\b",
            r"\b(?:cannot|can't|unable)\b",
            r"\bassum\w*",
            r"\b(?:therefore|thus)\b",
        ),
        3: _cues(
            r"\b(?:error|exception|fail\w*|warning|incorrect|invalid)\b",
            r"\bassum\w*",
            r"\bresult\w*\b",
        ),
        4: _cues(
            r"\b(?:error|exception|fail\w*)\b",
            r"\b(?:completed|created|final answer|TERMINATE)\b",
        ),
    },
}

# Steps that visibly go wrong: the "errors" focal-step strategy centres the view on the earliest of them.
_ERROR_CUES = _cues(
    r"\b(?:error|exception|traceback|failed|failure|fails|incorrect|wrong|invalid|warning)\b",
    r"\bnot found\b",
    r"\b(?:cannot|can't|unable)\b",
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


# --------------------------------------------------------------------------------------------------------------
# Hierarchical context


@dataclass(frozen=True, slots=True)
class Extract:
    """A reduced step: the chosen sentence cut to the level's word cap, and whether a cue pattern picked it."""

    text: str
    cue_matched: bool


@dataclass(frozen=True, slots=True)
class ContextLine:
    """One step of a hierarchical view.

    Attributes:
        index / agent: the step's id and agent.
        level: 1 (full) to 4 (milestone), from ``distance``.
        distance: steps to the nearest focal step.
        text: the full content (level 1) or the extract (levels 2-4).
        cue_matched: the extract came from a cue sentence (always True for level 1).
    """

    index: int
    agent: str
    level: int
    distance: int
    text: str
    cue_matched: bool

    @property
    def focal(self) -> bool:
        return self.distance == 0


@dataclass(frozen=True, slots=True)
class ContextView:
    """A rendered view and what was done to fit it under the character cap.

    Attributes:
        text: the rendered view.
        fits: ``len(text) <= char_cap`` (always True without a cap).
        full_char_cap: the cap applied to level-1 contents, None when none was needed.
        omitted: the steps left out (each shown only inside a ``[steps a-b omitted]`` marker).
    """

    text: str
    fits: bool
    full_char_cap: int | None = None
    omitted: tuple[int, ...] = ()


def context_level(distance: int) -> int:
    """The level of a step ``distance`` steps from the focal step: 1 (0-1), 2 (2-3), 3 (4-6), 4 (further)."""
    if distance <= 1:
        return 1
    if distance <= 3:
        return 2
    if distance <= 6:
        return 3
    return 4


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split at ``.``/``!``/``?`` followed by whitespace and at line breaks; blanks dropped."""
    return [sentence.strip() for sentence in _SENTENCE_END.split(text) if sentence.strip()]


def _cut_words(sentence: str, words: int) -> str:
    tokens = sentence.split()
    text = " ".join(tokens[:words])
    # A sentence without spaces (a URL, a blob of JSON) would pass any word cap: characters are capped too.
    limit = words * _CHARS_PER_WORD
    if len(text) > limit:
        return text[:limit] + " ..."
    return text if len(tokens) <= words else text + " ..."


def extract_cue(text: str, level: int, context_type: str = "decision-quality") -> Extract:
    """Reduce a step's content for ``level`` (2-4): the first cue sentence, else the first sentence, word-capped.

    Raises:
        ValueError: ``level`` is not 2, 3 or 4, or ``context_type`` is unknown.
    """
    if level not in LEVEL_WORDS:
        raise ValueError(f"level must be 2, 3 or 4, not {level}")
    if context_type not in _CUE_SETS:
        raise ValueError(f"unknown context type {context_type!r}")
    sentences = split_sentences(text)
    if not sentences:
        return Extract("(empty)", False)
    pattern = _CUE_SETS[context_type][level]
    for sentence in sentences:
        if pattern.search(sentence):
            return Extract(_cut_words(sentence, LEVEL_WORDS[level]), True)
    return Extract(_cut_words(sentences[0], LEVEL_WORDS[level]), False)


def key_decision(text: str, context_type: str = "decision-quality") -> str:
    """Level 2: the key decision or reasoning sentence, at most 50 words."""
    return extract_cue(text, 2, context_type).text


def outcome_summary(text: str, context_type: str = "decision-quality") -> str:
    """Level 3: a short outcome (result, assumption, warning), at most 20 words."""
    return extract_cue(text, 3, context_type).text


def milestone(text: str, context_type: str = "decision-quality") -> str:
    """Level 4: a milestone or major state change, at most 15 words."""
    return extract_cue(text, 4, context_type).text


def context_lines(
    trajectory: Trajectory, focal: int | Sequence[int], context_type: str = "decision-quality"
) -> tuple[ContextLine, ...]:
    """Every step of ``trajectory`` at its level, by its distance to the nearest focal step.

    Raises:
        ValueError: no focal step, or a focal step outside the trajectory.
    """
    focal_steps = sorted({focal} if isinstance(focal, int) else set(focal))
    if not focal_steps:
        raise ValueError("at least one focal step is needed")
    if focal_steps[0] < 0 or focal_steps[-1] >= trajectory.n_steps:
        raise ValueError(f"focal steps {focal_steps} outside [0, {trajectory.n_steps})")
    lines = []
    for step in trajectory.steps:
        distance = min(abs(step.index - f) for f in focal_steps)
        level = context_level(distance)
        if level == 1:
            extract = Extract(step.content, True)
        else:
            extract = extract_cue(step.content, level, context_type)
        lines.append(ContextLine(step.index, step.agent, level, distance, extract.text, extract.cue_matched))
    return tuple(lines)


def _cut_middle(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    head = cap // 2
    tail = cap - head
    return text[:head] + _CUT.format(n=len(text) - cap) + (text[-tail:] if tail else "")


def _render(lines: Sequence[ContextLine], full_cap: int | None, omitted: frozenset[int]) -> str:
    out: list[str] = []
    run_start: int | None = None
    previous = -1
    for line in lines:
        if line.index in omitted:
            if run_start is None:
                run_start = line.index
            previous = line.index
            continue
        if run_start is not None:
            out.append(_gap(run_start, previous))
            run_start = None
        if line.level == 1:
            content = line.text if full_cap is None else _cut_middle(line.text, full_cap)
            tag = " | focal" if line.focal else ""
            out.append(f"[step {line.index}{tag}] {line.agent}: {content}")
        else:
            out.append(f"[step {line.index} | {_LEVEL_TAGS[line.level]}] {line.agent}: {line.text}")
    if run_start is not None:
        out.append(_gap(run_start, previous))
    return "\n".join(out)


def _gap(first: int, last: int) -> str:
    return f"[step {first} omitted]" if first == last else f"[steps {first}-{last} omitted]"


def fit_context(lines: Sequence[ContextLine], char_cap: int | None = None) -> ContextView:
    """Render ``lines``, shrunk to ``char_cap`` characters by the fixed order in the module docstring.

    First the largest common cap (≥ 1,000 characters) on level-1 contents; then reduced lines left out, fewest
    first. ``fits`` is False only when even the smallest view (every reduced line out, level-1 contents at 1,000
    characters) is longer than the cap.
    """
    full = _render(lines, None, frozenset())
    if char_cap is None or len(full) <= char_cap:
        return ContextView(full, True)

    def fits(text: str) -> bool:
        return len(text) <= char_cap

    longest = max((len(line.text) for line in lines if line.level == 1), default=0)
    floor = min(_MIN_FULL_CHARS, longest)
    if fits(_render(lines, floor, frozenset())):
        low, high = floor, longest  # invariant: `low` fits; search the largest cap that fits
        while low < high:
            mid = (low + high + 1) // 2
            if fits(_render(lines, mid, frozenset())):
                low = mid
            else:
                high = mid - 1
        return ContextView(_render(lines, low, frozenset()), True, full_char_cap=low)

    order = _omission_order(lines)
    applied = floor if floor < longest else None  # None: no level-1 content is long enough to be cut

    def view(count: int) -> str:
        return _render(lines, floor, frozenset(order[:count]))

    if not fits(view(len(order))):
        return ContextView(view(len(order)), False, full_char_cap=applied, omitted=tuple(sorted(order)))
    low, high = 0, len(order)  # invariant: `low` does not fit, `high` fits; search the fewest omissions
    while high - low > 1:
        mid = (low + high) // 2
        if fits(view(mid)):
            high = mid
        else:
            low = mid
    return ContextView(view(high), True, full_char_cap=applied, omitted=tuple(sorted(order[:high])))


def _omission_order(lines: Sequence[ContextLine]) -> list[int]:
    """Reduced steps, the first to leave out first: L4 without a cue, L4, L3, L2; farthest, then latest, first."""
    reduced = [line for line in lines if line.level > 1]
    reduced.sort(key=lambda line: (-line.level, line.cue_matched, -line.distance, -line.index))
    return [line.index for line in reduced]


def hierarchical_context(
    trajectory: Trajectory,
    focal: int | Sequence[int],
    *,
    context_type: str = "decision-quality",
    char_cap: int | None = None,
) -> str:
    """The hierarchical view of ``trajectory`` around ``focal`` (one step or several), as the analysts see it."""
    return fit_context(context_lines(trajectory, focal, context_type), char_cap).text


def build_context(
    trajectory: Trajectory,
    focal: int | Sequence[int],
    *,
    context_type: str = "decision-quality",
    char_cap: int | None = None,
) -> ContextView:
    """Like `hierarchical_context`, with what was done to fit the cap."""
    return fit_context(context_lines(trajectory, focal, context_type), char_cap)


def _spread(n_steps: int, count: int) -> list[int]:
    if n_steps <= 0 or count <= 0:
        return []
    if count == 1:
        return [(n_steps - 1) // 2]
    return sorted({(j * (n_steps - 1) + (count - 1) // 2) // (count - 1) for j in range(count)})


def choose_focal_steps(
    trajectory: Trajectory, focal: str | Sequence[int] = "errors", max_focal: int = 5
) -> tuple[int, ...]:
    """The focal steps of the analysts' view, sorted (strategies in the module docstring)."""
    n = trajectory.n_steps
    if not isinstance(focal, str):
        chosen = sorted({index for index in focal if 0 <= index < n})
        return tuple(chosen) if chosen else tuple(_spread(n, max_focal))
    if focal == "spread":
        return tuple(_spread(n, max_focal))
    if focal != "errors":
        raise ValueError(f"unknown focal strategy {focal!r}")
    picked = [step.index for step in trajectory.steps if _ERROR_CUES.search(step.content)][:max_focal]
    for index in _spread(n, max_focal):
        if len(picked) >= max_focal:
            break
        if index not in picked:
            picked.append(index)
    return tuple(sorted(picked))


# --------------------------------------------------------------------------------------------------------------
# Analyst answers


@dataclass(frozen=True, slots=True)
class Conclusion:
    """An analyst's primary conclusion, validated (agents recorded, step inside the log when read from an answer)."""

    type: str
    attribution: tuple[str, ...]
    mistake_step: int
    confidence: float
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One valid per-agent evaluation."""

    agent: str
    step_index: int
    error_likelihood: float


@dataclass(frozen=True, slots=True)
class AnswerReading:
    """What one analyst answer yields.

    Attributes:
        conclusion: the primary conclusion, None when the answer is malformed.
        evaluations: its valid agent evaluations (they count for the fallback even when ``conclusion`` is None).
        problems: why the answer is malformed (empty when it is well-formed).
        skipped: why individual agent evaluations were skipped.
        alternatives: the alternative hypotheses as answered (objects only), reported, never voted.
    """

    conclusion: Conclusion | None
    evaluations: tuple[Evaluation, ...] = ()
    problems: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    alternatives: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Vote:
    """One analyst's conclusion as it enters the vote (in decoupled mode, the paired conclusion)."""

    analyst: int
    conclusion: Conclusion


def _is_unit(value: object) -> TypeGuard[float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0.0 <= value <= 1.0
    )


def read_answer(answer: object, agents: Sequence[str], n_steps: int) -> AnswerReading:
    """Validate one analyst answer strictly (never repaired); see the module docstring for the rules."""
    if not isinstance(answer, dict):
        return AnswerReading(None, problems=("the answer is not a JSON object",))
    problems: list[str] = []
    if not isinstance(answer.get("summary"), str):
        problems.append("summary is missing or not a string")
    if not isinstance(answer.get("alternative_hypotheses"), list):
        problems.append("alternative_hypotheses is missing or not an array")
    evaluations: list[Evaluation] = []
    skipped: list[str] = []
    raw_evaluations = answer.get("agent_evaluations")
    if not isinstance(raw_evaluations, list):
        problems.append("agent_evaluations is missing or not an array")
        raw_evaluations = []
    for position, entry in enumerate(raw_evaluations):
        read = _read_evaluation(entry, agents, n_steps)
        if isinstance(read, Evaluation):
            evaluations.append(read)
        else:
            skipped.append(f"agent_evaluations[{position}]: {read}")
    conclusion_problems: list[str] = []
    conclusion = _read_conclusion(answer.get("primary_conclusion"), agents, n_steps, conclusion_problems)
    problems.extend(conclusion_problems)
    raw_alternatives = answer.get("alternative_hypotheses")
    alternatives = (
        tuple(a for a in raw_alternatives if isinstance(a, dict))
        if isinstance(raw_alternatives, list)
        else ()
    )
    return AnswerReading(
        conclusion if not problems else None,
        tuple(evaluations),
        tuple(problems),
        tuple(skipped),
        alternatives,
    )


def _read_evaluation(entry: object, agents: Sequence[str], n_steps: int) -> Evaluation | str:
    """One agent evaluation, or why it is skipped."""
    if not isinstance(entry, dict):
        return "not an object"
    agent, likelihood = entry.get("agent"), entry.get("error_likelihood")
    if not isinstance(agent, str) or agent not in agents:
        return f"unknown agent {agent!r}"
    if not _is_unit(likelihood):
        return f"error_likelihood {likelihood!r} is not a number in [0, 1]"
    step = parse_step(entry.get("step_index"))
    if step is None or not 0 <= step < n_steps:
        return f"step_index {entry.get('step_index')!r} is not a step of the log"
    return Evaluation(agent, step, float(likelihood))


def _read_conclusion(
    raw: object, agents: Sequence[str], n_steps: int, problems: list[str]
) -> Conclusion | None:
    if not isinstance(raw, dict):
        problems.append("primary_conclusion is missing or not an object")
        return None
    kind = raw.get("type")
    if kind not in CONCLUSION_TYPES:
        problems.append(f"primary_conclusion.type {kind!r} is not single_agent or multi_agent")
    attribution = raw.get("attribution")
    if not isinstance(attribution, list) or not attribution:
        problems.append("primary_conclusion.attribution is missing, empty or not an array")
    else:
        unknown = [name for name in attribution if not isinstance(name, str) or name not in agents]
        if unknown:
            problems.append(f"primary_conclusion.attribution names unrecorded agents {unknown!r}")
    step = parse_step(raw.get("mistake_step"))
    if step is None:
        problems.append(f"primary_conclusion.mistake_step {raw.get('mistake_step')!r} is not an integer")
    elif not 0 <= step < n_steps:
        problems.append(f"primary_conclusion.mistake_step {step} is outside [0, {n_steps})")
    confidence = raw.get("confidence")
    if not _is_unit(confidence):
        problems.append(f"primary_conclusion.confidence {confidence!r} is not a number in [0, 1]")
    reasoning = raw.get("reasoning")
    if not isinstance(reasoning, str):
        problems.append("primary_conclusion.reasoning is missing or not a string")
    if problems or not (  # once `problems` is empty, the second test only narrows the types for the checker
        isinstance(kind, str)
        and isinstance(attribution, list)
        and step is not None
        and _is_unit(confidence)
        and isinstance(reasoning, str)
    ):
        return None
    return Conclusion(
        type=kind,
        attribution=tuple(dict.fromkeys(attribution)),
        mistake_step=step,
        confidence=float(confidence),
        reasoning=reasoning,
    )


def pair_conclusion(agent_focused: Conclusion, step_focused: Conclusion) -> Conclusion:
    """Decoupled mode: who from the agent-focused answer, where from the step-focused one, weight = the lower."""
    return Conclusion(
        type=agent_focused.type,
        attribution=agent_focused.attribution,
        mistake_step=step_focused.mistake_step,
        confidence=min(agent_focused.confidence, step_focused.confidence),
        reasoning=f"who: {agent_focused.reasoning}\nwhere: {step_focused.reasoning}",
    )


# --------------------------------------------------------------------------------------------------------------
# Consensus vote


@dataclass(frozen=True, slots=True)
class VoteOutcome:
    """The result of `consensus_vote`.

    Attributes:
        kept / dropped: analyst indices of the votes kept and dropped by the confidence filter.
        type_sums: summed confidence per conclusion type (kept votes).
        winning_type: the type of the consensus, None when no vote was kept.
        agent_scores / step_scores: summed confidence per agent / step in the winning group, ranked (score
            descending, ties by recorded order / earliest step).
        attribution: the attributed agents, ranked; ``attribution[0]`` is the answer.
        mistake_step: the chosen step, None when no step inside the log was voted (or the fallback had none).
        confidence: mean confidence of the winning votes (None for the fallback or an abstention).
        fallback_used: no vote was kept and the answer comes from mean error likelihoods.
        agent_mean_likelihood: mean error_likelihood per agent over the valid evaluations, recorded order.
        confidence_spread: max - min confidence of all votes given (before the filter), None without votes.
        review_reasons: why the consensus requires review (empty when it does not).
    """

    kept: tuple[int, ...]
    dropped: tuple[int, ...]
    type_sums: Mapping[str, float]
    winning_type: str | None
    agent_scores: tuple[tuple[str, float], ...]
    step_scores: tuple[tuple[int, float], ...]
    attribution: tuple[str, ...]
    mistake_step: int | None
    confidence: float | None
    fallback_used: bool
    agent_mean_likelihood: Mapping[str, float] = field(default_factory=dict)
    confidence_spread: float | None = None
    review_reasons: tuple[str, ...] = ()

    @property
    def role(self) -> str | None:
        return self.attribution[0] if self.attribution else None

    @property
    def requires_review(self) -> bool:
        return bool(self.review_reasons)


def _score(value: float) -> float:
    return round(value, _SCORE_DIGITS)


def consensus_vote(
    votes: Sequence[Vote],
    evaluations: Sequence[Evaluation] = (),
    *,
    agents: Sequence[str],
    n_steps: int,
    min_confidence: float = 0.3,
) -> VoteOutcome:
    """Confidence-weighted vote over the analysts' conclusions, with the fallback and the disagreement report.

    Args:
        votes: one per analyst that produced a well-formed conclusion (agents are assumed recorded; steps outside
            ``[0, n_steps)`` are tallied but never chosen).
        evaluations: all valid agent evaluations, for the fallback.
        agents: the recorded agents, in recorded order (the agent tie rule).
        n_steps: the log's length.
        min_confidence: votes below it are dropped; in a multi_agent consensus, the score an agent needs.
    """
    rank = {agent: position for position, agent in enumerate(agents)}
    kept = [vote for vote in votes if vote.conclusion.confidence >= min_confidence]
    dropped = tuple(vote.analyst for vote in votes if vote.conclusion.confidence < min_confidence)
    type_sums = {
        kind: math.fsum(v.conclusion.confidence for v in kept if v.conclusion.type == kind)
        for kind in CONCLUSION_TYPES
    }
    review = _review_reasons(votes, kept)
    spread = _spread_of(votes)
    means = _mean_likelihoods(evaluations, rank)

    if not kept:
        fallback_agent, fallback_step = _fallback(evaluations, means)
        return VoteOutcome(
            kept=(),
            dropped=dropped,
            type_sums=type_sums,
            winning_type=None,
            agent_scores=(),
            step_scores=(),
            attribution=(fallback_agent,) if fallback_agent is not None else (),
            mistake_step=fallback_step,
            confidence=None,
            fallback_used=fallback_agent is not None,
            agent_mean_likelihood=means,
            confidence_spread=spread,
            review_reasons=review,
        )

    # A tie between the types goes to single_agent: CONCLUSION_TYPES lists it first and max keeps the first.
    winning_type = max(CONCLUSION_TYPES, key=lambda kind: _score(type_sums[kind]))
    group = [vote for vote in kept if vote.conclusion.type == winning_type]
    agent_totals: dict[str, list[float]] = {}
    step_totals: dict[int, list[float]] = {}
    for vote in group:
        for agent in dict.fromkeys(vote.conclusion.attribution):
            agent_totals.setdefault(agent, []).append(vote.conclusion.confidence)
        step_totals.setdefault(vote.conclusion.mistake_step, []).append(vote.conclusion.confidence)
    agent_scores = sorted(
        ((agent, math.fsum(values)) for agent, values in agent_totals.items()),
        key=lambda item: (-_score(item[1]), rank.get(item[0], len(rank)), item[0]),
    )
    step_scores = sorted(
        ((step, math.fsum(values)) for step, values in step_totals.items()),
        key=lambda item: (-_score(item[1]), item[0]),
    )
    if winning_type == "single_agent":
        attribution: tuple[str, ...] = (agent_scores[0][0],)
    else:
        attribution = tuple(agent for agent, score in agent_scores if _score(score) >= _score(min_confidence))
    in_range = [step for step, _ in step_scores if 0 <= step < n_steps]
    return VoteOutcome(
        kept=tuple(vote.analyst for vote in kept),
        dropped=dropped,
        type_sums=type_sums,
        winning_type=winning_type,
        agent_scores=tuple(agent_scores),
        step_scores=tuple(step_scores),
        attribution=attribution,
        mistake_step=in_range[0] if in_range else None,
        confidence=math.fsum(vote.conclusion.confidence for vote in group) / len(group),
        fallback_used=False,
        agent_mean_likelihood=means,
        confidence_spread=spread,
        review_reasons=review,
    )


def _spread_of(votes: Sequence[Vote]) -> float | None:
    if not votes:
        return None
    confidences = [vote.conclusion.confidence for vote in votes]
    return max(confidences) - min(confidences)


def _review_reasons(votes: Sequence[Vote], kept: Sequence[Vote]) -> tuple[str, ...]:
    reasons = []
    types = {vote.conclusion.type for vote in kept}
    if len(types) > 2:
        reasons.append(f"{len(types)} conclusion types")
    spread = _spread_of(votes)
    if spread is not None and _score(spread) > _REVIEW_SPREAD:
        reasons.append(f"confidence spread {spread:.2f} > {_REVIEW_SPREAD}")
    return tuple(reasons)


def _mean_likelihoods(evaluations: Sequence[Evaluation], rank: Mapping[str, int]) -> dict[str, float]:
    collected: dict[str, list[float]] = {}
    for evaluation in evaluations:
        collected.setdefault(evaluation.agent, []).append(evaluation.error_likelihood)
    ordered = sorted(collected, key=lambda agent: (rank.get(agent, len(rank)), agent))
    return {agent: math.fsum(collected[agent]) / len(collected[agent]) for agent in ordered}


def _fallback(evaluations: Sequence[Evaluation], means: Mapping[str, float]) -> tuple[str | None, int | None]:
    if not means:
        return None, None
    # `means` is in recorded order and max keeps the first of equal scores.
    agent = max(means, key=lambda name: _score(means[name]))
    own = [evaluation for evaluation in evaluations if evaluation.agent == agent]
    best = min(own, key=lambda evaluation: (-_score(evaluation.error_likelihood), evaluation.step_index))
    return agent, best.step_index


# --------------------------------------------------------------------------------------------------------------
# The method


@dataclass(frozen=True, slots=True)
class AnalystSpec:
    """One member of the panel."""

    persona: str
    temperature: float


@dataclass(frozen=True, slots=True)
class EchoOptions:
    analysts: int = 3
    personas: tuple[str, ...] | None = None
    temperatures: tuple[float, ...] | None = None
    temperature_range: tuple[float, float] = (0.3, 0.9)
    seed: int = 2026
    decoupled: bool = False
    min_confidence: float = 0.3
    context_type: ContextType = "decision-quality"
    focal: str | tuple[int, ...] = "errors"
    max_focal: int = 5
    context_chars: int = 100_000
    max_tokens: int = 8000
    reasoning: Reasoning | None = None
    include_task: bool = True
    include_ground_truth: bool = False

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> EchoOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"echo: unknown option(s) {unknown}; known: {sorted(known)}")
        values = dict(options)
        for name in ("personas", "temperatures", "temperature_range"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        if isinstance(values.get("focal"), list):
            values["focal"] = tuple(values["focal"])
        parsed = cls(**values)
        parsed._validate()
        return parsed

    def _validate(self) -> None:
        def fail(message: str) -> None:
            raise ConfigError(f"echo: {message}")

        for name in ("analysts", "max_focal", "context_chars", "max_tokens", "seed"):
            if not is_int(getattr(self, name)):
                fail(f"{name} must be an integer")
        for name in ("decoupled", "include_task", "include_ground_truth"):
            if not isinstance(getattr(self, name), bool):
                fail(f"{name} must be true or false")
        for name in ("personas", "temperatures"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), tuple):
                fail(f"{name} must be a list")
        if not isinstance(self.temperature_range, tuple):
            fail("temperature_range must be a list [low, high]")
        if self.analysts < 1:
            fail("analysts must be at least 1")
        if self.personas is None:
            if self.analysts > len(PERSONAS):
                fail(f"analysts > {len(PERSONAS)} needs an explicit personas list (a sample has no repeats)")
        else:
            if len(self.personas) != self.analysts:
                fail(f"personas lists {len(self.personas)} names for {self.analysts} analysts")
            unknown = [name for name in self.personas if name not in PERSONAS]
            if unknown:
                fail(f"unknown persona(s) {unknown}; known: {list(PERSONAS)}")
        if self.temperatures is not None:
            if len(self.temperatures) != self.analysts:
                fail(f"temperatures lists {len(self.temperatures)} values for {self.analysts} analysts")
            if not all(_is_number(t) and 0.0 <= t <= 2.0 for t in self.temperatures):
                fail("temperatures must be numbers in [0, 2]")
        low_high = self.temperature_range
        if (
            len(low_high) != 2
            or not all(_is_number(t) for t in low_high)
            or not 0.0 <= low_high[0] <= low_high[1] <= 2.0
        ):
            fail("temperature_range must be [low, high] with 0 <= low <= high <= 2")
        if not _is_number(self.min_confidence) or not 0.0 <= self.min_confidence <= 1.0:
            fail("min_confidence must be a number in [0, 1]")
        if self.context_type not in CONTEXT_TYPES:
            fail(f"context_type must be one of {list(CONTEXT_TYPES)}")
        if isinstance(self.focal, str):
            if self.focal not in ("errors", "spread"):
                fail("focal must be 'errors', 'spread' or a list of step indices")
        elif not self.focal or not all(is_int(index) for index in self.focal):
            fail("focal must be 'errors', 'spread' or a non-empty list of step indices")
        if self.max_focal < 1:
            fail("max_focal must be at least 1")
        if self.context_chars < _MIN_CONTEXT_CHARS:
            fail(f"context_chars must be at least {_MIN_CONTEXT_CHARS}")
        if self.max_tokens <= 0:
            fail("max_tokens must be a positive integer")
        if self.reasoning not in (None, "off", "low", "medium", "high"):
            fail("reasoning must be one of off, low, medium, high")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def analyst_panel(options: EchoOptions) -> tuple[AnalystSpec, ...]:
    """The analysts' personas and temperatures: configured, or drawn from ``random.Random(options.seed)``."""
    rng = random.Random(options.seed)
    personas = (
        list(options.personas) if options.personas is not None else rng.sample(PERSONAS, options.analysts)
    )
    if options.temperatures is not None:
        temperatures = [float(t) for t in options.temperatures]
    else:
        low, high = options.temperature_range
        temperatures = [round(rng.uniform(low, high), 2) for _ in personas]
    return tuple(AnalystSpec(p, t) for p, t in zip(personas, temperatures, strict=True))


def answer_schema(trajectory: Trajectory) -> dict[str, Any]:
    """The analysts' answer schema: recorded agents as enums, the step range as integer bounds."""
    agent = {"type": "string", "enum": list(trajectory.agents)}
    step = {"type": "integer", "minimum": 0, "maximum": trajectory.n_steps - 1}
    unit = {"type": "number", "minimum": 0, "maximum": 1}
    conclusion = {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": list(CONCLUSION_TYPES)},
            "attribution": {"type": "array", "items": agent, "minItems": 1},
            "mistake_step": step,
            "confidence": unit,
            "reasoning": {"type": "string"},
        },
        "required": ["type", "attribution", "mistake_step", "confidence", "reasoning"],
        "additionalProperties": False,
    }
    evaluation = {
        "type": "object",
        "properties": {
            "agent": agent,
            "step_index": step,
            "error_likelihood": unit,
            "reasoning": {"type": "string"},
            "evidence": {"type": "string"},
        },
        "required": ["agent", "step_index", "error_likelihood", "reasoning", "evidence"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "summary": {"type": "string"},
            "agent_evaluations": {"type": "array", "items": evaluation},
            "primary_conclusion": conclusion,
            "alternative_hypotheses": {"type": "array", "items": conclusion, "maxItems": 3},
        },
        "required": ["summary", "agent_evaluations", "primary_conclusion", "alternative_hypotheses"],
        "additionalProperties": False,
    }


def _prompt_text(name: str) -> str:
    return resources.files("rcarun.methods").joinpath("prompts", name).read_text(encoding="utf-8")


def _named_lines(name: str) -> dict[str, str]:
    """``name: text`` lines of a prompt file (blank lines and ``#`` comments skipped)."""
    entries = {}
    for line in _prompt_text(name).splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, text = line.partition(":")
            entries[key.strip()] = text.strip()
    return entries


class Echo(Method):
    """Hierarchical context → k (or 2k) independent analyst calls → confidence-weighted consensus."""

    def __init__(self, label: str, options: EchoOptions) -> None:
        self.label = label
        self.options = options
        self.panel = analyst_panel(options)
        self._system = Template(_prompt_text("echo_system.txt").strip())
        self._user = Template(_prompt_text("echo_user.txt"))
        self._personas = _named_lines("echo_personas.txt")
        self._focus = _named_lines("echo_focus.txt")
        missing = [p for p in PERSONAS if p not in self._personas] + [
            f for f in ("joint", "agent", "step") if f not in self._focus
        ]
        if missing:
            raise RuntimeError(f"echo prompt files lack {missing}")

    @property
    def focuses(self) -> tuple[str, ...]:
        """The calls each analyst makes, in order."""
        return ("agent", "step") if self.options.decoupled else ("joint",)

    def system_prompt(self, spec: AnalystSpec) -> str:
        return self._system.substitute(persona=self._personas[spec.persona])

    def user_prompt(self, trajectory: Trajectory, view: str, focal: Sequence[int], focus: str) -> str:
        schema_text = _schema_text(trajectory)
        task = task_text(trajectory, include=self.options.include_task)
        ground_truth = ""
        if self.options.include_ground_truth:
            ground_truth = (
                f"\nThe correct final answer to the task: {trajectory.ground_truth or '(not recorded)'}\n"
            )
        return self._user.substitute(
            task=task,
            ground_truth=ground_truth,
            agents=", ".join(trajectory.agents),
            n_steps=trajectory.n_steps,
            focal=", ".join(str(index) for index in focal),
            log=view,
            focus=self._focus[focus],
            schema=schema_text,
        )

    def build_view(
        self, trajectory: Trajectory, llm: LLM
    ) -> tuple[ContextView, tuple[int, ...], dict[str, Any]]:
        """The analysts' view, fitted to ``context_chars`` and to ``llm``'s context window when known."""
        focal = choose_focal_steps(trajectory, self.options.focal, self.options.max_focal)
        lines = context_lines(trajectory, focal, self.options.context_type)
        cap = self.options.context_chars
        view = fit_context(lines, cap)
        info: dict[str, Any] = {"context_type": self.options.context_type, "focal_steps": list(focal)}
        window = llm.context_window
        if window is not None:
            system = max((self.system_prompt(spec) for spec in self.panel), key=len)
            focus = max(self.focuses, key=lambda name: len(self._focus[name]))
            allowed = window - self.options.max_tokens - _CONTEXT_MARGIN_TOKENS - llm.estimate_tokens(system)
            info["context_window"] = window
            # Each round shrinks the cap in proportion to the overshoot, a little more to absorb estimate error.
            for _ in range(8):
                needed = llm.estimate_tokens(self.user_prompt(trajectory, view.text, focal, focus))
                if needed <= allowed or cap <= _MIN_CONTEXT_CHARS:
                    break
                cap = max(_MIN_CONTEXT_CHARS, min(cap - 1, int(cap * max(allowed, 0) / needed * 0.95)))
                view = fit_context(lines, cap)
        info.update(
            char_cap=cap,
            chars=len(view.text),
            fits=view.fits,
            full_char_cap=view.full_char_cap,
            omitted_steps=len(view.omitted),
            levels={str(level): sum(1 for line in lines if line.level == level) for level in (1, 2, 3, 4)},
            cue_fallbacks=sum(1 for line in lines if not line.cue_matched),
        )
        return view, focal, info

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        if trajectory.n_steps == 0:
            return Attribution(
                None, None, False, False, abstained=True, output={"abstain_reason": "empty log"}
            )
        view, focal, context_info = self.build_view(trajectory, llm)
        schema = answer_schema(trajectory)
        calls: list[dict[str, Any]] = []
        votes: list[Vote] = []
        evaluations: list[Evaluation] = []
        alternatives: list[tuple[int, Mapping[str, Any]]] = []
        for analyst, spec in enumerate(self.panel):
            readings: list[AnswerReading] = []
            for focus in self.focuses:
                messages = [
                    Message("system", self.system_prompt(spec)),
                    Message("user", self.user_prompt(trajectory, view.text, focal, focus)),
                ]
                reply = await llm.chat(
                    messages,
                    stage="analyst",
                    max_tokens=self.options.max_tokens,
                    schema=schema,
                    temperature=spec.temperature,
                    reasoning=self.options.reasoning,
                )
                reading = read_answer(reply.parsed, trajectory.agents, trajectory.n_steps)
                readings.append(reading)
                evaluations.extend(reading.evaluations)
                alternatives.extend((analyst, a) for a in reading.alternatives)
                record: dict[str, Any] = {
                    "analyst": analyst,
                    "persona": spec.persona,
                    "temperature": spec.temperature,
                    "focus": focus,
                    "answer": reply.parsed if isinstance(reply.parsed, dict) else None,
                    "finish_reason": reply.finish_reason,
                    "well_formed": reading.conclusion is not None,
                    "problems": list(reading.problems),
                    "skipped_evaluations": list(reading.skipped),
                }
                if not isinstance(reply.parsed, dict):
                    record["parse_error"] = reply.parse_error or "the answer is not a JSON object"
                    record["raw_text"] = reply.text[:2000]
                calls.append(record)
            first, last = readings[0].conclusion, readings[-1].conclusion
            if first is not None and last is not None:
                # Decoupled: the agent-focused call came first, the step-focused one last.
                votes.append(Vote(analyst, first if len(readings) == 1 else pair_conclusion(first, last)))

        outcome = consensus_vote(
            votes,
            evaluations,
            agents=trajectory.agents,
            n_steps=trajectory.n_steps,
            min_confidence=self.options.min_confidence,
        )
        output = self._output(context_info, calls, votes, outcome, alternatives)
        role, step = outcome.role, outcome.mistake_step
        return Attribution(
            pred_role=role,
            pred_step=step,
            role_valid=role_is_valid(role, trajectory),
            step_valid=step_is_valid(step, trajectory),
            abstained=role is None and step is None,
            output=output,
            error=_unusable(calls, evaluations),
            fallback=self._rules_that_decided(outcome, votes, trajectory.n_steps),
        )

    def _rules_that_decided(self, outcome: VoteOutcome, votes: Sequence[Vote], n_steps: int) -> str | None:
        """The design's rules that decided the answer instead of the votes (module docstring), or None."""
        malformed = len(self.panel) - len(votes)
        low, floor = len(outcome.dropped), self.options.min_confidence
        if outcome.fallback_used:
            return (
                f"echo: no vote kept ({malformed} of {len(self.panel)} analysts malformed, {low} below "
                f"min_confidence {floor}); agent with the highest mean error likelihood and its most likely "
                "step chosen (published fallback)"
            )
        if outcome.winning_type is None:
            if low:
                return (
                    f"echo: all {low} well-formed votes below min_confidence {floor} and no valid agent "
                    "evaluation: abstains (published rule)"
                )
            return None
        ties = []
        sums = [_score(value) for value in outcome.type_sums.values()]
        if len(sums) > 1 and sums.count(max(sums)) > 1:
            ties.append("conclusion types tied, single_agent taken")
        scores = [_score(score) for _, score in outcome.agent_scores]
        if len(scores) > 1 and scores[0] == scores[1]:
            ties.append("top agents tied, first in recorded order taken")
        steps = [_score(score) for step, score in outcome.step_scores if 0 <= step < n_steps]
        if len(steps) > 1 and steps[0] == steps[1]:
            ties.append("top steps tied, earliest taken")
        return f"echo: {'; '.join(ties)} (published tie rules)" if ties else None

    def _output(
        self,
        context_info: Mapping[str, Any],
        calls: Sequence[Mapping[str, Any]],
        votes: Sequence[Vote],
        outcome: VoteOutcome,
        alternatives: Sequence[tuple[int, Mapping[str, Any]]],
    ) -> dict[str, Any]:
        personas = {analyst: spec.persona for analyst, spec in enumerate(self.panel)}
        kept = set(outcome.kept)
        consensus: dict[str, Any] | None = None
        if outcome.winning_type is not None:
            winners = [v for v in votes if v.analyst in kept and v.conclusion.type == outcome.winning_type]
            consensus = {
                "type": outcome.winning_type,
                "attribution": list(outcome.attribution),
                "mistake_step": outcome.mistake_step,
                "confidence": outcome.confidence,
                "reasoning": _synthesis(outcome, winners, personas, len(self.panel)),
            }
        ranked_alternatives = sorted(
            alternatives,
            key=lambda item: -(float(item[1]["confidence"]) if _is_unit(item[1].get("confidence")) else 0.0),
        )
        return {
            "n_analysts": len(self.panel),
            "n_calls": len(calls),
            "decoupled": self.options.decoupled,
            "panel": [{"persona": s.persona, "temperature": s.temperature} for s in self.panel],
            "context": dict(context_info),
            "calls": list(calls),
            "vote_table": {
                "min_confidence": self.options.min_confidence,
                "votes": [
                    {
                        "analyst": v.analyst,
                        "persona": personas[v.analyst],
                        "type": v.conclusion.type,
                        "attribution": list(v.conclusion.attribution),
                        "mistake_step": v.conclusion.mistake_step,
                        "confidence": v.conclusion.confidence,
                        "kept": v.analyst in kept,
                    }
                    for v in votes
                ],
                "malformed_analysts": sorted(set(range(len(self.panel))) - {v.analyst for v in votes}),
                "type_sums": dict(outcome.type_sums),
                "winning_type": outcome.winning_type,
                "agent_scores": [{"agent": a, "score": s} for a, s in outcome.agent_scores],
                "step_scores": [{"step": st, "score": s} for st, s in outcome.step_scores],
            },
            "consensus": consensus,
            "agent_mean_likelihood": dict(outcome.agent_mean_likelihood),
            "alternative_hypotheses": [
                {"analyst": analyst, **dict(hypothesis)}
                for analyst, hypothesis in ranked_alternatives[:_MAX_ALTERNATIVES]
            ],
            "disagreement": {
                "requires_review": outcome.requires_review,
                "reasons": list(outcome.review_reasons),
                "confidence_spread": outcome.confidence_spread,
            },
            "fallback": {
                "used": outcome.fallback_used,
                "agent": outcome.role if outcome.fallback_used else None,
                "step": outcome.mistake_step if outcome.fallback_used else None,
            },
        }


def _unusable(calls: Sequence[Mapping[str, Any]], evaluations: Sequence[Evaluation]) -> str | None:
    """Why no analyst answer could be used, when none could (module docstring), else None."""
    if not calls or evaluations or any(call["well_formed"] for call in calls):
        return None
    first = calls[0]
    reason = first.get("parse_error") or "; ".join(first["problems"][:3]) or "malformed answer"
    return f"no analyst answer could be used ({len(calls)} of {len(calls)} calls malformed); first: {reason}"


def _schema_text(trajectory: Trajectory) -> str:
    return json.dumps(answer_schema(trajectory), ensure_ascii=False)


def _synthesis(outcome: VoteOutcome, winners: Sequence[Vote], personas: Mapping[int, str], panel: int) -> str:
    """A deterministic account of the consensus, built from the winning votes (no LLM call)."""
    names = ", ".join(personas[v.analyst] for v in winners)
    agents = ", ".join(f"{agent} ({score:.2f})" for agent, score in outcome.agent_scores)
    steps = ", ".join(f"{step} ({score:.2f})" for step, score in outcome.step_scores)
    lines = [
        f"{outcome.winning_type} conclusion backed by {len(winners)} of {panel} analysts ({names}); "
        f"agent scores: {agents}; step scores: {steps}."
    ]
    lines.extend(f"[{personas[v.analyst]}] {v.conclusion.reasoning}" for v in winners)
    return "\n".join(lines)


@method("echo")
def _create_echo(label: str, options: Mapping[str, Any]) -> Echo:
    return Echo(label, EchoOptions.from_mapping(options))
