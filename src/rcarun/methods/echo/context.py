"""ECHO's hierarchical context (part 1 of the method): levels of detail around target steps, built without an LLM.

The paper compresses a log with regex pattern extraction, not with a model, so everything here is deterministic
and tested on its own. Around a target step i (the paper's position-aware context C_i):

- L1 = steps i-1, i and i+1 in full;
- L2 = steps i±2..3, reduced to a key decision or reasoning sentence (≤50 words);
- L3 = steps i±4..6, reduced to a short outcome (≤20 words);
- L4 = every step further away, reduced to a milestone (≤15 words).

A reduction is the first sentence that matches the level's cue patterns ("Therefore/Thus ...", "The answer is ...",
"I conclude ...", "completed/created ...", error and warning cues), cut to the level's word cap, and to 8
characters per allowed word so that a sentence without spaces (a URL, a blob of JSON) cannot pass. When no
sentence of the step matches, its first non-empty sentence is cut the same way (``cue_matched=False``). The
paper's three context types are alternative cue sets (``decision-quality``, the default; ``handoff``;
``error-propagation``). Sentences end at ``.``, ``!`` or ``?`` followed by whitespace, and at line breaks.

A view with several targets shows every step at the level of its distance to the NEAREST target. For the
consecutive targets of a window [first, last] that is the union of the targets' C_i (`StepLevels.window_lines`);
for the focal steps of ``context="focal"`` it is rcarun's own multi-focal view (`context_lines`,
`choose_focal_steps`).

Fitting a view to a character cap (`fit_context`) applies this fixed order until it fits: (a) L1 contents are
cut in the middle (head and tail kept, the cut marked) to the largest common cap, not below 1,000 characters;
(b) reduced lines are left out, replaced by ``[steps a-b omitted]``: first L4 lines without a cue, then L4 lines
with a cue, then L3, then L2, each farthest from a target first (the later step first on ties). L1 lines are
never left out.

Target windows (`plan_windows`, `target_windows`) make every step of the log a target exactly once. The log is
tiled greedily from step 0: each window is the longest run of consecutive targets whose view, with nothing cut
and no line left out, fits the cap; a single target whose view does not fit even so is a window of its own,
fitted by the rules above. When that tiling needs more than ``max_views`` windows, the log is instead cut into
``max_views`` windows of equal target counts (sizes differ by at most one, the longer windows first), each view
fitted by the rules above. Window sizes come from per-step line lengths by level and prefix sums
(`StepLevels.full_chars`), so planning renders nothing; only the chosen windows are rendered.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal, get_args

from rcarun.data import Trajectory

__all__ = [
    "CONTEXT_TYPES",
    "LEVEL_WORDS",
    "ContextLine",
    "ContextType",
    "ContextView",
    "Extract",
    "StepLevels",
    "TargetWindow",
    "Tiling",
    "WindowPlan",
    "build_context",
    "choose_focal_steps",
    "context_level",
    "context_lines",
    "equal_windows",
    "extract_cue",
    "fit_context",
    "hierarchical_context",
    "key_decision",
    "milestone",
    "outcome_summary",
    "plan_windows",
    "split_sentences",
    "target_windows",
]

ContextType = Literal["decision-quality", "handoff", "error-propagation"]
CONTEXT_TYPES: tuple[str, ...] = get_args(ContextType)
Tiling = Literal["greedy", "equal"]
LEVEL_WORDS: Mapping[int, int] = {2: 50, 3: 20, 4: 15}
"""Word cap of a reduced step, by level (L1 is shown in full)."""

_CHARS_PER_WORD = 8  # an extract is also cut at 8 characters per allowed word (400/160/120 characters)
_LEVEL_TAGS: Mapping[int, str] = {2: "L2 key decision", 3: "L3 outcome", 4: "L4 milestone"}
_MIN_FULL_CHARS = 1000  # L1 contents are never cut below this when the view must shrink
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


def _cut_middle(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    head = cap // 2
    tail = cap - head
    return text[:head] + _CUT.format(n=len(text) - cap) + (text[-tail:] if tail else "")


def _full_prefix(index: int, agent: str, tag: str | None) -> str:
    return f"[step {index} | {tag}] {agent}: " if tag else f"[step {index}] {agent}: "


def _reduced_prefix(index: int, agent: str, level: int) -> str:
    return f"[step {index} | {_LEVEL_TAGS[level]}] {agent}: "


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
            out.append(_gap(run_start, previous))
            run_start = None
        if line.level == 1:
            content = line.text if full_cap is None else _cut_middle(line.text, full_cap)
            tag = target_tag if line.focal else None
            out.append(_full_prefix(line.index, line.agent, tag) + content)
        else:
            out.append(_reduced_prefix(line.index, line.agent, line.level) + line.text)
    if run_start is not None:
        out.append(_gap(run_start, previous))
    return "\n".join(out)


def _gap(first: int, last: int) -> str:
    return f"[step {first} omitted]" if first == last else f"[steps {first}-{last} omitted]"


def fit_context(
    lines: Sequence[ContextLine], char_cap: int | None = None, *, target_tag: str | None = "focal"
) -> ContextView:
    """Render ``lines``, shrunk to ``char_cap`` characters by the fixed order in the module docstring.

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
    floor = min(_MIN_FULL_CHARS, longest)
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


def _spread(n_steps: int, count: int) -> list[int]:
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
# Target windows


class StepLevels:
    """Every step of a log reduced for each level once, with the length of its rendered line at each level.

    A window's view is then sized by prefix sums (`full_chars`) instead of being rendered, and rendered from the
    same extracts (`window_lines`), so the size used to plan a window is the length of its rendered view.
    """

    def __init__(
        self, trajectory: Trajectory, context_type: str = "decision-quality", *, target_tag: str = "target"
    ) -> None:
        if context_type not in _CUE_SETS:
            raise ValueError(f"unknown context type {context_type!r}")
        self.trajectory = trajectory
        self.context_type = context_type
        self.target_tag = target_tag
        self._extracts: list[dict[int, Extract]] = []
        target: list[int] = []
        by_level: dict[int, list[int]] = {level: [] for level in (1, 2, 3, 4)}
        for step in trajectory.steps:
            sentences = split_sentences(step.content)
            extracts = {level: _extract(sentences, level, context_type) for level in LEVEL_WORDS}
            self._extracts.append(extracts)
            target.append(len(_full_prefix(step.index, step.agent, target_tag)) + len(step.content))
            by_level[1].append(len(_full_prefix(step.index, step.agent, None)) + len(step.content))
            for level, extract in extracts.items():
                by_level[level].append(
                    len(_reduced_prefix(step.index, step.agent, level)) + len(extract.text)
                )
        self._lengths = by_level  # line length of step k at level L: by_level[L][k]
        self._targets = [0, *accumulate(target)]
        self._far = [0, *accumulate(by_level[4])]
        # The shortest line a step can have in a view where it is no target: a lower bound on any view's size.
        self._shortest = [
            0,
            *accumulate(min(by_level[level][k] for level in by_level) for k in range(len(target))),
        ]

    @property
    def n_steps(self) -> int:
        return self.trajectory.n_steps

    def full_chars(self, first: int, last: int) -> int:
        """Length of the view of targets ``first..last`` rendered with nothing cut and no line left out."""
        n = self.n_steps
        total = self._targets[last + 1] - self._targets[first] + max(n - 1, 0)  # targets, and the line breaks
        total += self._far[max(first - _FAR + 1, 0)]  # steps before, at level 4
        total += self._far[n] - self._far[min(last + _FAR, n)]  # steps after, at level 4
        for distance in range(1, _FAR):
            level = context_level(distance)
            if first - distance >= 0:
                total += self._lengths[level][first - distance]
            if last + distance < n:
                total += self._lengths[level][last + distance]
        return total

    def least_chars(self, first: int, last: int) -> int:
        """A lower bound of `full_chars` that never decreases as ``last`` grows (a target line is never shorter
        than the same step's shortest line)."""
        outside = self._shortest[first] + self._shortest[self.n_steps] - self._shortest[last + 1]
        return self._targets[last + 1] - self._targets[first] + outside + max(self.n_steps - 1, 0)

    def window_lines(self, first: int, last: int) -> tuple[ContextLine, ...]:
        """Every step at its level by its distance to the nearest of the targets ``first..last``."""
        lines = []
        for step in self.trajectory.steps:
            distance = first - step.index if step.index < first else max(step.index - last, 0)
            level = context_level(distance)
            extract = Extract(step.content, True) if level == 1 else self._extracts[step.index][level]
            lines.append(
                ContextLine(step.index, step.agent, level, distance, extract.text, extract.cue_matched)
            )
        return tuple(lines)


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """How the log is tiled into target windows.

    Attributes:
        spans: ``(first, last)`` targets of each window, in order; they tile ``[0, n_steps)`` exactly once.
        tiling: ``"greedy"`` (longest windows that fit whole) or ``"equal"`` (``max_views`` equal windows).
    """

    spans: tuple[tuple[int, int], ...]
    tiling: Tiling


@dataclass(frozen=True, slots=True)
class TargetWindow:
    """One per-target view: its targets ``first..last`` and the view as fitted to the cap."""

    first: int
    last: int
    view: ContextView
    levels: Mapping[int, int]
    cue_fallbacks: int

    @property
    def targets(self) -> range:
        return range(self.first, self.last + 1)


def equal_windows(n_steps: int, count: int) -> tuple[tuple[int, int], ...]:
    """``count`` windows of consecutive targets tiling ``[0, n_steps)``, sizes differing by at most one."""
    count = min(count, n_steps)
    size, longer = divmod(n_steps, count) if count else (0, 0)
    spans = []
    first = 0
    for window in range(count):
        last = first + size + (1 if window < longer else 0) - 1
        spans.append((first, last))
        first = last + 1
    return tuple(spans)


def plan_windows(levels: StepLevels, char_cap: int | None, max_views: int) -> WindowPlan:
    """The target windows of the log (rules in the module docstring); no view is rendered.

    Raises:
        ValueError: ``max_views`` is below 1.
    """
    if max_views < 1:
        raise ValueError(f"max_views must be at least 1, not {max_views}")
    n = levels.n_steps
    if n == 0:
        return WindowPlan((), "greedy")
    if char_cap is None:
        return WindowPlan(((0, n - 1),), "greedy")
    spans: list[tuple[int, int]] = []
    first = 0
    while first < n:
        best = first  # a lone target that does not fit whole is still a window, fitted later
        for last in range(first, n):
            if levels.least_chars(first, last) > char_cap:
                break  # no longer window can fit either
            if levels.full_chars(first, last) <= char_cap:
                best = last
        spans.append((first, best))
        if len(spans) > max_views:
            return WindowPlan(equal_windows(n, max_views), "equal")
        first = best + 1
    return WindowPlan(tuple(spans), "greedy")


def target_windows(
    levels: StepLevels, char_cap: int | None, max_views: int
) -> tuple[WindowPlan, tuple[TargetWindow, ...]]:
    """The planned windows, each view rendered and fitted to ``char_cap``.

    A single window whose targets are the whole log is rendered without target tags (every line is a target),
    so a log that fits whole reads exactly as the log.
    """
    plan = plan_windows(levels, char_cap, max_views)
    whole = plan.spans == ((0, levels.n_steps - 1),)
    windows = []
    for first, last in plan.spans:
        lines = levels.window_lines(first, last)
        view = fit_context(lines, char_cap, target_tag=None if whole else levels.target_tag)
        windows.append(
            TargetWindow(
                first=first,
                last=last,
                view=view,
                levels={level: sum(1 for line in lines if line.level == level) for level in (1, 2, 3, 4)},
                cue_fallbacks=sum(1 for line in lines if not line.cue_matched),
            )
        )
    return plan, tuple(windows)
