"""Agentic reading: the judge reads the trajectory through tools instead of getting the whole log inlined.

`TrajectoryReader` (``read_steps``, ``search``, ``list_roles``; errors become tool results, never exceptions),
`EvidenceLedger` (deduplicated evidence tokens, as paper 003 counts them) and `converse_with_tools` (one capped
tool turn). The caps and the choices the paper leaves open are in ``docs/methods/common.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcarun.data import Trajectory
from rcarun.methods.base import is_int
from rcarun.methods.llm import LLM, Message, Reasoning, Reply, ToolCall, ToolChoice

__all__ = [
    "DEDUPE_NGRAM",
    "EvidenceLedger",
    "ToolResult",
    "ToolTurn",
    "TrajectoryReader",
    "converse_with_tools",
]

DEDUPE_NGRAM = 13
"""Span length, in whitespace tokens, below which repeated text still counts as new evidence."""

_SEARCH_DEFAULT_HITS = 10
_SEARCH_MAX_HITS = 50
_SNIPPET_CONTEXT_CHARS = 160
_MAX_PATTERN_CHARS = 500
_BUDGET_EXHAUSTED = (
    "Not run: the tool-call budget of this turn ({limit} calls) is exhausted. Give your final answer now."
)
_FINAL_ANSWER_REQUEST = (
    "You have used all {limit} tool calls of this turn. Do not call tools again: give your final answer now, "
    "as the JSON object described above."
)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What one tool call returned.

    Attributes:
        content: the text sent back to the model as the tool message (the error text when ``error`` is set).
        error: why the call could not be served, or None.
        steps: the steps whose content (or a snippet of it) the result shows, in order.
        text_read: the trajectory text the result shows — what evidence accounting counts.
    """

    content: str
    error: str | None
    steps: tuple[int, ...]
    text_read: str


class _BadCall(Exception):
    """A call the reader cannot serve; its message goes back to the model."""


class TrajectoryReader:
    """Read-only tools over one trajectory: ``read_steps``, ``search`` and ``list_roles``.

    Attributes:
        steps_read: every step whose content (or a snippet of it) a tool has returned so far.
    """

    def __init__(self, trajectory: Trajectory, *, max_result_chars: int = 12_000) -> None:
        if max_result_chars < 1:
            raise ValueError(f"max_result_chars must be >= 1, got {max_result_chars}")
        self._trajectory = trajectory
        self._max_chars = max_result_chars
        self.steps_read: set[int] = set()

    @property
    def n_steps(self) -> int:
        return self._trajectory.n_steps

    def tool_specs(self) -> list[dict[str, Any]]:
        """The three tools as OpenAI function specs; step bounds are the log's (0..n-1)."""
        last = max(0, self.n_steps - 1)
        step_number = {"type": "integer", "minimum": 0, "maximum": last}
        return [
            _function(
                "read_steps",
                f"Read steps start..end (inclusive) of the log, numbered 0..{last}, as "
                f'"[step k] agent: content". Results are limited to {self._max_chars} characters; the answer '
                "says where to continue when a range does not fit.",
                {
                    "start": {**step_number, "description": "first step to read"},
                    "end": {**step_number, "description": "last step to read (>= start)"},
                },
                ["start", "end"],
            ),
            _function(
                "search",
                "Find the steps whose content matches a regular expression (Python syntax, case-insensitive). "
                "Returns one snippet per matching step, earliest steps first.",
                {
                    "pattern": {"type": "string", "description": "regular expression to search for"},
                    "max_hits": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": _SEARCH_MAX_HITS,
                        "description": f"most matching steps to return (default {_SEARCH_DEFAULT_HITS})",
                    },
                },
                ["pattern"],
            ),
            _function(
                "list_roles",
                "List the agents of the log with the steps each of them wrote.",
                {},
                [],
            ),
        ]

    def run(self, call: ToolCall) -> ToolResult:
        """Serve one call; bad input of any kind becomes a result whose error says what is valid."""
        try:
            arguments = _arguments(call)
            if call.name == "read_steps":
                return self._read_steps(arguments)
            if call.name == "search":
                return self._search(arguments)
            if call.name == "list_roles":
                _check_keys(call.name, arguments, required=(), optional=())
                return self._list_roles()
            raise _BadCall(f"unknown tool {call.name!r}; the tools are read_steps, search and list_roles")
        except _BadCall as bad:
            message = str(bad)
            return ToolResult(content=f"Error: {message}", error=message, steps=(), text_read="")

    # -- the tools --------------------------------------------------------------------------------------------

    def _read_steps(self, arguments: Mapping[str, Any]) -> ToolResult:
        _check_keys("read_steps", arguments, required=("start", "end"), optional=())
        last = self.n_steps - 1
        start = self._step_number(arguments, "start")
        end = self._step_number(arguments, "end")
        if start > last or end > last:
            raise _BadCall(f"steps {start}..{end} are outside the log: its steps are numbered 0..{last}")
        if start > end:
            raise _BadCall(f"start {start} is after end {end}: give start <= end, within 0..{last}")
        lines: list[str] = []
        contents: list[str] = []
        shown: list[int] = []
        used = 0
        for step in self._trajectory.steps[start : end + 1]:
            header = f"[step {step.index}] {step.agent}: "
            room = self._max_chars - used - len(header)
            if len(header) + len(step.content) <= self._max_chars - used:
                content = step.content
            elif not shown and room > 0:
                omitted = len(step.content) - room
                content = step.content[:room]
                lines.append(
                    header + content + f"\n[step {step.index} cut here: {omitted} more characters not shown; "
                    "use search to find text in them]"
                )
                contents.append(content)
                shown.append(step.index)
                break
            else:
                break
            lines.append(header + content)
            contents.append(content)
            shown.append(step.index)
            used += len(header) + len(content) + 1
        if shown and shown[-1] < end:
            lines.append(
                f"[steps {shown[-1] + 1}..{end} not shown: the {self._max_chars}-character result limit was "
                f"reached; call read_steps({shown[-1] + 1}, {end}) to continue]"
            )
        self.steps_read.update(shown)
        return ToolResult(
            content="\n".join(lines), error=None, steps=tuple(shown), text_read="\n".join(contents)
        )

    def _search(self, arguments: Mapping[str, Any]) -> ToolResult:
        _check_keys("search", arguments, required=("pattern",), optional=("max_hits",))
        pattern = arguments["pattern"]
        if not isinstance(pattern, str) or not pattern:
            raise _BadCall("pattern must be a non-empty string holding a regular expression")
        if len(pattern) > _MAX_PATTERN_CHARS:
            raise _BadCall(
                f"pattern is {len(pattern)} characters long; at most {_MAX_PATTERN_CHARS} are allowed"
            )
        max_hits = arguments.get("max_hits", _SEARCH_DEFAULT_HITS)
        if not is_int(max_hits) or not 1 <= max_hits <= _SEARCH_MAX_HITS:
            raise _BadCall(f"max_hits must be an integer from 1 to {_SEARCH_MAX_HITS}, got {max_hits!r}")
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as error:
            raise _BadCall(
                f"pattern {pattern!r} is not a valid regular expression ({error}); escape special characters "
                r"such as ( ) [ ] . * + ? with a backslash, e.g. \( for a literal parenthesis"
            ) from None
        lines: list[str] = []
        snippets: list[str] = []
        shown: list[int] = []
        matching = 0
        used = 0
        for step in self._trajectory.steps:
            matches = list(regex.finditer(step.content))
            if not matches:
                continue
            matching += 1
            if len(shown) >= max_hits:
                continue
            first = matches[0]
            begin = max(0, first.start() - _SNIPPET_CONTEXT_CHARS)
            finish = min(len(step.content), first.end() + _SNIPPET_CONTEXT_CHARS)
            snippet = step.content[begin:finish]
            line = (
                f"[step {step.index}] {step.agent} ({len(matches)} match{'es' if len(matches) > 1 else ''}): "
                f"{'…' if begin > 0 else ''}{snippet}{'…' if finish < len(step.content) else ''}"
            )
            if used + len(line) > self._max_chars:
                break
            lines.append(line)
            snippets.append(snippet)
            shown.append(step.index)
            used += len(line) + 1
        if not matching:
            return ToolResult(content=f"No step matches {pattern!r}.", error=None, steps=(), text_read="")
        summary = f"{matching} step{'s' if matching > 1 else ''} match {pattern!r}; showing {len(shown)}."
        self.steps_read.update(shown)
        return ToolResult(
            content="\n".join([summary, *lines]),
            error=None,
            steps=tuple(shown),
            text_read="\n".join(snippets),
        )

    def _list_roles(self) -> ToolResult:
        by_agent: dict[str, list[int]] = {}
        for step in self._trajectory.steps:
            by_agent.setdefault(step.agent, []).append(step.index)
        lines = [f"{len(self._trajectory.steps)} steps, numbered 0..{self.n_steps - 1}."]
        for agent, indices in by_agent.items():
            count = len(indices)
            lines.append(f"{agent}: {count} step{'s' if count > 1 else ''} ({_ranges(indices)})")
        return ToolResult(content="\n".join(lines), error=None, steps=(), text_read="")

    def _step_number(self, arguments: Mapping[str, Any], name: str) -> int:
        value = arguments[name]
        if not is_int(value) or value < 0:
            raise _BadCall(
                f"{name} must be a whole step number from 0 to {self.n_steps - 1}, got {json.dumps(value)}"
            )
        number: int = value
        return number


class EvidenceLedger:
    """Deduplicated evidence read so far, in whitespace tokens.

    The rule (`add`): a token of a new text is *new* unless some 13-token window containing it has been seen
    before — in an earlier text, or earlier in the same text. So re-reading a step adds nothing, reading a step
    that quotes 13+ tokens of another adds only what is not quoted, and a phrase shorter than 13 tokens counts
    again wherever it appears (it is too short to say the judge read the same evidence).

    Texts shorter than 13 tokens have no window: each is counted whole the first time its exact token sequence is
    added as a text of its own and 0 after that; it does not mark anything seen for longer texts.

    Attributes:
        total: new tokens over every `add` so far.
    """

    def __init__(self) -> None:
        self._windows: set[tuple[str, ...]] = set()
        self._short_texts: set[tuple[str, ...]] = set()
        self.total = 0

    def add(self, text: str) -> int:
        """Count ``text``'s new tokens (see the class docstring), remember its 13-grams, and return the count."""
        tokens = text.split()
        if not tokens:
            return 0
        if len(tokens) < DEDUPE_NGRAM:
            key = tuple(tokens)
            if key in self._short_texts:
                return 0
            self._short_texts.add(key)
            self.total += len(tokens)
            return len(tokens)
        covered = [False] * len(tokens)
        for start in range(len(tokens) - DEDUPE_NGRAM + 1):
            window = tuple(tokens[start : start + DEDUPE_NGRAM])
            if window in self._windows:
                covered[start : start + DEDUPE_NGRAM] = [True] * DEDUPE_NGRAM
            else:
                self._windows.add(window)
        new = covered.count(False)
        self.total += new
        return new


@dataclass(frozen=True, slots=True)
class ToolTurn:
    """One turn of a tool conversation.

    Attributes:
        reply: the final reply (the answer; when ``capped``, the reply that still asked for tools).
        messages: the input conversation, every tool exchange, and the final assistant message (content =
            ``reply.text``, without unanswered tool calls) — ready for a next turn to continue.
        tool_log: one entry per tool call the model asked for: ``name``, ``arguments`` (as sent), ``error``,
            ``steps`` returned, ``result_chars``, ``evidence_tokens`` (new deduplicated tokens) and ``executed``
            (False for calls refused once the budget was spent).
        tool_calls: tool calls executed (at most the cap).
        calls: ``llm.chat`` calls made.
        capped: the model asked for tools after the budget was spent and told to answer.
        evidence_tokens: new deduplicated evidence tokens read in this turn.
    """

    reply: Reply
    messages: list[Message]
    tool_log: list[dict[str, Any]]
    tool_calls: int
    calls: int
    capped: bool
    evidence_tokens: int


async def converse_with_tools(
    llm: LLM,
    messages: Sequence[Message],
    *,
    reader: TrajectoryReader,
    ledger: EvidenceLedger,
    stage: str,
    max_tokens: int,
    schema: Mapping[str, Any] | None,
    temperature: float | None,
    reasoning: Reasoning | None,
    max_tool_calls: int,
) -> ToolTurn:
    """Run one turn: call with the reader's tools until the model answers without calling any.

    Every tool call is answered by a ``tool`` message; at most ``max_tool_calls`` are executed, the rest are
    answered "budget exhausted", and once the budget is spent the model is asked for its final answer with
    ``tool_choice="none"`` (docs/methods/common.md).

    Raises:
        ValueError: ``max_tool_calls`` is below 1.
        Whatever ``llm.chat`` raises (fatal call errors, budget exhaustion) propagates.
    """
    if max_tool_calls < 1:
        raise ValueError(f"max_tool_calls must be >= 1, got {max_tool_calls}")
    conversation = list(messages)
    tools = reader.tool_specs()
    tool_log: list[dict[str, Any]] = []
    executed = 0
    calls = 0
    evidence = 0
    tool_choice: ToolChoice | None = None
    while True:
        reply = await llm.chat(
            conversation,
            stage=stage,
            max_tokens=max_tokens,
            schema=schema,
            temperature=temperature,
            reasoning=reasoning,
            tools=tools,
            tool_choice=tool_choice,
        )
        calls += 1
        capped = bool(reply.tool_calls) and tool_choice == "none"
        if not reply.tool_calls or capped:
            conversation.append(Message("assistant", reply.text))
            return ToolTurn(
                reply=reply,
                messages=conversation,
                tool_log=tool_log,
                tool_calls=executed,
                calls=calls,
                capped=capped,
                evidence_tokens=evidence,
            )
        conversation.append(Message("assistant", reply.text, tool_calls=reply.tool_calls))
        for call in reply.tool_calls:
            if executed < max_tool_calls:
                executed += 1
                result = reader.run(call)
                new_tokens = ledger.add(result.text_read)
                evidence += new_tokens
                content = result.content
                tool_log.append(
                    _log_entry(call, result.error, result.steps, len(content), new_tokens, executed=True)
                )
            else:
                content = _BUDGET_EXHAUSTED.format(limit=max_tool_calls)
                tool_log.append(
                    _log_entry(call, "tool-call budget exhausted", (), len(content), 0, executed=False)
                )
            conversation.append(Message("tool", content, tool_call_id=call.id))
        if executed >= max_tool_calls:
            conversation.append(Message("user", _FINAL_ANSWER_REQUEST.format(limit=max_tool_calls)))
            tool_choice = "none"


def _log_entry(
    call: ToolCall, error: str | None, steps: tuple[int, ...], chars: int, evidence: int, *, executed: bool
) -> dict[str, Any]:
    return {
        "name": call.name,
        "arguments": call.arguments,
        "error": error,
        "steps": list(steps),
        "result_chars": chars,
        "evidence_tokens": evidence,
        "executed": executed,
    }


def _function(
    name: str, description: str, properties: Mapping[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": dict(properties),
                "required": required,
                "additionalProperties": False,
            },
        },
    }


def _arguments(call: ToolCall) -> Mapping[str, Any]:
    text = call.arguments.strip()
    if not text:
        return {}  # some providers send "" for a function without parameters
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise _BadCall(
            f"the arguments of {call.name} are not valid JSON ({error.msg} at character {error.pos}); send one "
            'JSON object, e.g. {"start": 0, "end": 5} for read_steps'
        ) from None
    if not isinstance(value, dict):
        raise _BadCall(f"the arguments of {call.name} must be a JSON object, got {type(value).__name__}")
    return value


def _check_keys(
    name: str, arguments: Mapping[str, Any], *, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    missing = [key for key in required if key not in arguments]
    unknown = sorted(set(arguments) - set(required) - set(optional))
    if not missing and not unknown:
        return
    takes = ", ".join([*required, *(f"{key} (optional)" for key in optional)]) or "no arguments"
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown {', '.join(unknown)}")
    raise _BadCall(f"{name}: {'; '.join(problems)}; {name} takes {takes}")


def _ranges(indices: Sequence[int]) -> str:
    """``0, 3-5, 9`` for [0, 3, 4, 5, 9]."""
    parts: list[str] = []
    start = previous = indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    return ", ".join(parts)
