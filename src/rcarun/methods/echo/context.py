"""ECHO's hierarchical context (part 1 of the method): levels of detail around target steps, built without an LLM.

Around a target step i, L1 = i±1 in full, L2 = i±2..3 as a key decision, L3 = i±4..6 as an outcome, L4 the rest
as milestones, reduced by regex cues as the paper does. Cue sets, sentence rules and the fitting order:
``docs/methods/echo.md``. Single views (``whole-log``, ``focal``) are rendered here; the per-target document
is `rcarun.methods.echo.targets`.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from rcarun.data import Trajectory

__all__ = [
    "CONTEXT_TYPES",
    "LEVEL_WORDS",
    "MIN_FULL_CHARS",
    "ContextLine",
    "ContextType",
    "ContextView",
    "Extract",
    "build_context",
    "choose_focal_steps",
    "context_level",
    "context_lines",
    "cut_middle",
    "extract_cue",
    "fit_context",
    "full_line",
    "hierarchical_context",
    "key_decision",
    "milestone",
    "omission_marker",
    "outcome_summary",
    "reduced_line",
    "split_sentences",
    "spread_steps",
]

ContextType = Literal["decision-quality", "handoff", "error-propagation"]
CONTEXT_TYPES: tuple[str, ...] = get_args(ContextType)
LEVEL_WORDS: Mapping[int, int] = {2: 50, 3: 20, 4: 15}
"""Word cap of a reduced step, by level (L1 is shown in full)."""

_CHARS_PER_WORD = 8  # an extract is also cut at 8 characters per allowed word (400/160/120 characters)
_LEVEL_TAGS: Mapping[int, str] = {2: "L2 key decision", 3: "L3 outcome", 4: "L4 milestone"}
MIN_FULL_CHARS = 1000
"""L1 contents are never cut below this many characters when a view must shrink."""
_CUT = " [... {n} characters cut ...] "
_FAR = 7  # the first distance at level 4 (context_level)


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
        distance: steps to the nearest target (focal) step.
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
        """A target of the view (a focal step of ``context="focal"``)."""
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

    @property
    def whole(self) -> bool:
        """Nothing was cut and no line left out."""
        return self.full_char_cap is None and not self.omitted


def context_level(distance: int) -> int:
    """The level of a step ``distance`` steps from the target: 1 (0-1), 2 (2-3), 3 (4-6), 4 (further)."""
    if distance <= 1:
        return 1
    if distance <= 3:
        return 2
    if distance < _FAR:
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


def _check(level: int, context_type: str) -> None:
    if level not in LEVEL_WORDS:
        raise ValueError(f"level must be 2, 3 or 4, not {level}")
    if context_type not in _CUE_SETS:
        raise ValueError(f"unknown context type {context_type!r}")


def _extract(sentences: Sequence[str], level: int, context_type: str) -> Extract:
    if not sentences:
        return Extract("(empty)", False)
    pattern = _CUE_SETS[context_type][level]
    for sentence in sentences:
        if pattern.search(sentence):
            return Extract(_cut_words(sentence, LEVEL_WORDS[level]), True)
    return Extract(_cut_words(sentences[0], LEVEL_WORDS[level]), False)


def extract_cue(text: str, level: int, context_type: str = "decision-quality") -> Extract:
    """Reduce a step's content for ``level`` (2-4): the first cue sentence, else the first sentence, word-capped.

    Raises:
        ValueError: ``level`` is not 2, 3 or 4, or ``context_type`` is unknown.
    """
    _check(level, context_type)
    return _extract(split_sentences(text), level, context_type)


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
    """Every step of ``trajectory`` at its level, by its distance to the nearest focal (target) step.

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
        # The nearest focal step is one of the two around the step's place in the sorted list.
        at = bisect_left(focal_steps, step.index)
        distance = min(abs(step.index - focal_steps[i]) for i in (at - 1, at) if 0 <= i < len(focal_steps))
        level = context_level(distance)
        if level == 1:
            extract = Extract(step.content, True)
        else:
            extract = extract_cue(step.content, level, context_type)
        lines.append(ContextLine(step.index, step.agent, level, distance, extract.text, extract.cue_matched))
    return tuple(lines)


def cut_middle(text: str, cap: int) -> str:
    """``text`` cut in the middle to ``cap`` characters, head and tail kept and the cut marked."""
    if len(text) <= cap:
        return text
    head = cap // 2
    tail = cap - head
    return text[:head] + _CUT.format(n=len(text) - cap) + (text[-tail:] if tail else "")


def _full_prefix(index: int, agent: str, tag: str | None) -> str:
    return f"[step {index} | {tag}] {agent}: " if tag else f"[step {index}] {agent}: "


def _reduced_prefix(index: int, agent: str, level: int) -> str:
    return f"[step {index} | {_LEVEL_TAGS[level]}] {agent}: "


def full_line(index: int, agent: str, content: str, tag: str | None = None) -> str:
    """A step shown in full: ``[step k] agent: content``, or ``[step k | tag] agent: content``."""
    return _full_prefix(index, agent, tag) + content


def reduced_line(index: int, agent: str, level: int, text: str) -> str:
    """A step reduced for ``level`` (2-4): ``[step k | L2 key decision] agent: extract`` and so on."""
    return _reduced_prefix(index, agent, level) + text


def _render(
    lines: Sequence[ContextLine], full_cap: int | None, omitted: frozenset[int], target_tag: str | None
) -> str:
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
            out.append(omission_marker(run_start, previous))
            run_start = None
        if line.level == 1:
            content = line.text if full_cap is None else cut_middle(line.text, full_cap)
            tag = target_tag if line.focal else None
            out.append(_full_prefix(line.index, line.agent, tag) + content)
        else:
            out.append(_reduced_prefix(line.index, line.agent, line.level) + line.text)
    if run_start is not None:
        out.append(omission_marker(run_start, previous))
    return "\n".join(out)


def omission_marker(first: int, last: int) -> str:
    """The line that stands for steps ``first..last`` left out of a view."""
    return f"[step {first} omitted]" if first == last else f"[steps {first}-{last} omitted]"


def fit_context(
    lines: Sequence[ContextLine], char_cap: int | None = None, *, target_tag: str | None = "focal"
) -> ContextView:
    """Render ``lines``, shrunk to ``char_cap`` characters by the fixed order of ``docs/methods/echo.md``.

    First the largest common cap (≥ 1,000 characters) on level-1 contents; then reduced lines left out, fewest
    first. ``fits`` is False only when even the smallest view (every reduced line out, level-1 contents at 1,000
    characters) is longer than the cap. Target lines are tagged ``[step k | <target_tag>]`` (untagged when None).
    """
    full = _render(lines, None, frozenset(), target_tag)
    if char_cap is None or len(full) <= char_cap:
        return ContextView(full, True)

    def fits(text: str) -> bool:
        return len(text) <= char_cap

    def render(full_cap: int | None, omitted: frozenset[int] = frozenset()) -> str:
        return _render(lines, full_cap, omitted, target_tag)

    longest = max((len(line.text) for line in lines if line.level == 1), default=0)
    floor = min(MIN_FULL_CHARS, longest)
    if fits(render(floor)):
        low, high = floor, longest  # invariant: `low` fits; search the largest cap that fits
        while low < high:
            mid = (low + high + 1) // 2
            if fits(render(mid)):
                low = mid
            else:
                high = mid - 1
        return ContextView(render(low), True, full_char_cap=low)

    order = _omission_order(lines)
    applied = floor if floor < longest else None  # None: no level-1 content is long enough to be cut

    def view(count: int) -> str:
        return render(floor, frozenset(order[:count]))

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


def spread_steps(n_steps: int, count: int) -> list[int]:
    """``count`` evenly spaced steps of ``[0, n_steps)``, both ends included from two on, sorted and distinct."""
    if n_steps <= 0 or count <= 0:
        return []
    if count == 1:
        return [(n_steps - 1) // 2]
    return sorted({(j * (n_steps - 1) + (count - 1) // 2) // (count - 1) for j in range(count)})


def choose_focal_steps(
    trajectory: Trajectory, focal: str | Sequence[int] = "errors", max_focal: int = 5
) -> tuple[int, ...]:
    """The focal steps of ``context="focal"``'s single view, sorted.

    ``"errors"``: the earliest ``max_focal`` steps whose content carries an error or warning cue, topped up with
    evenly spaced steps when fewer match; ``"spread"``: ``max_focal`` evenly spaced steps; a list: those steps
    (indices outside the log are ignored, and ``"spread"`` is used when none remains).
    """
    n = trajectory.n_steps
    if not isinstance(focal, str):
        chosen = sorted({index for index in focal if 0 <= index < n})
        return tuple(chosen) if chosen else tuple(spread_steps(n, max_focal))
    if focal == "spread":
        return tuple(spread_steps(n, max_focal))
    if focal != "errors":
        raise ValueError(f"unknown focal strategy {focal!r}")
    picked = [step.index for step in trajectory.steps if _ERROR_CUES.search(step.content)][:max_focal]
    for index in spread_steps(n, max_focal):
        if len(picked) >= max_focal:
            break
        if index not in picked:
            picked.append(index)
    return tuple(sorted(picked))
