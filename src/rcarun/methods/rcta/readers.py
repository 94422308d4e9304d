"""Readers of RCTA's stage answers: decoded JSON into the typed values of `schemas`, every problem recorded.

Readers never repair: a value of the wrong type is left out and an out-of-range one kept as answered, and
either way a `FieldError` records it. A step id may be a JSON integer or a string of decimal digits (paper
Sec. 5.1 fails only "missing, nonnumeric, or out-of-range steps"); rules in ``docs/methods/rcta.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rcarun.data import Trajectory
from rcarun.methods.base import is_int

from .schemas import (
    CANDIDATE_TAGS,
    SEVERITIES,
    VERIFIER_RESULTS,
    AttributionAnswer,
    ChainNode,
    Conflict,
    DelegationTrace,
    FailureSignal,
    FieldError,
    KeyEvent,
    LocalSummary,
    Outline,
    Phase,
    StepProposal,
    SubPhase,
    VerifierFinding,
)

__all__ = ["parse_attribution", "parse_local_summary", "parse_outline"]

_STEP_STRING = re.compile(r"\s*[+-]?[0-9]+\s*")
_MISSING: Any = object()  # a key absent from an answer, as opposed to a JSON null
_Allowed = frozenset[int] | range | None  # the ids a list may hold; None: any
_ANALYSIS_FIELDS = ("delegation_trace", "failure_chain", "counterfactual", "confidence")


def _step_id(value: object) -> int | None:
    """``value`` as a step id: a JSON integer, or a string of decimal digits (optional sign); else None."""
    if is_int(value):
        return value
    if isinstance(value, str) and _STEP_STRING.fullmatch(value):
        return int(value)
    return None


class _Reader:
    """Reads typed values out of decoded JSON, recording a `FieldError` for everything it cannot use."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def error(self, field: str, message: str) -> None:
        self.errors.append(FieldError(field, message))

    def get(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> Any:
        """The value at ``key``, or `_MISSING` (recorded) when the key is absent; a null is returned as None."""
        if key not in obj:
            self.error(field, f"{path}: missing")
            return _MISSING
        return obj[key]

    def string(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> str | None:
        value = self.get(obj, key, field, path)
        if value is _MISSING:
            return None
        if not isinstance(value, str):
            self.error(field, f"{path}: expected a string, got {type(value).__name__}")
            return None
        return value

    def boolean(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> bool | None:
        value = self.get(obj, key, field, path)
        if value is _MISSING:
            return None
        if not isinstance(value, bool):
            self.error(field, f"{path}: expected true or false, got {value!r}")
            return None
        return value

    def integer(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> int | None:
        value = self.get(obj, key, field, path)
        if value is _MISSING:
            return None
        if not is_int(value):
            self.error(field, f"{path}: expected an integer, got {value!r}")
            return None
        return int(value)

    def step(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> int | None:
        """A step id: a JSON integer, or a string of decimal digits read as one."""
        value = self.get(obj, key, field, path)
        if value is _MISSING:
            return None
        step = _step_id(value)
        if step is None:
            self.error(field, f"{path}: expected a step id (an integer), got {value!r}")
        return step

    def array(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> list[Any] | None:
        value = self.get(obj, key, field, path)
        if value is _MISSING:
            return None
        if not isinstance(value, list):
            self.error(field, f"{path}: expected a list, got {type(value).__name__}")
            return None
        return value

    def objects(
        self, obj: Mapping[str, Any], key: str, field: str, path: str
    ) -> list[tuple[str, dict[str, Any]]]:
        items = self.array(obj, key, field, path)
        found: list[tuple[str, dict[str, Any]]] = []
        for position, item in enumerate(items or ()):
            if isinstance(item, dict):
                found.append((f"{path}[{position}]", item))
            else:
                self.error(field, f"{path}[{position}]: expected an object, skipped")
        return found

    def ints(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> tuple[int, ...] | None:
        items = self.array(obj, key, field, path)
        if items is None:
            return None
        bad = [item for item in items if not is_int(item)]
        if bad:
            self.error(field, f"{path}: non-integer ids {bad[:5]!r} left out")
        return tuple(int(item) for item in items if is_int(item))

    def strings(self, obj: Mapping[str, Any], key: str, field: str, path: str) -> tuple[str, ...] | None:
        items = self.array(obj, key, field, path)
        if items is None:
            return None
        bad = [item for item in items if not isinstance(item, str)]
        if bad:
            self.error(field, f"{path}: non-string items {bad[:5]!r} left out")
        return tuple(item for item in items if isinstance(item, str))

    def step_ids(
        self, obj: Mapping[str, Any], key: str, field: str, path: str, allowed: _Allowed = None
    ) -> tuple[int, ...] | None:
        """A list of step ids (digit strings read as integers); items that are no step id are left out."""
        items = self.array(obj, key, field, path)
        if items is None:
            return None
        read = [_step_id(item) for item in items]
        bad = [item for item, step in zip(items, read, strict=True) if step is None]
        if bad:
            self.error(field, f"{path}: non-integer ids {bad[:5]!r} left out")
        ids = tuple(step for step in read if step is not None)
        if allowed is not None:
            self.id_range(ids, allowed, field, path)
        return ids

    def step_range(
        self, obj: Mapping[str, Any], key: str, field: str, path: str, allowed: frozenset[int] | range
    ) -> tuple[int, int] | None:
        items = self.array(obj, key, field, path)
        if items is None:
            return None
        read = [_step_id(item) for item in items]
        if len(read) != 2 or read[0] is None or read[1] is None:
            self.error(field, f"{path}: expected [first, last] integers, got {items!r}")
            return None
        first, last = read[0], read[1]
        if first > last:
            self.error(field, f"{path}: first {first} is after last {last}")
        self.id_range((first, last), allowed, field, path)
        return (first, last)

    def enum(self, value: str | None, allowed: Iterable[str], field: str, path: str) -> None:
        allowed = tuple(allowed)
        if value is not None and value not in allowed:
            self.error(field, f"{path}: {value!r} is not one of {', '.join(allowed)}")

    def id_range(self, ids: Iterable[int], allowed: frozenset[int] | range, field: str, path: str) -> None:
        outside = sorted({i for i in ids if i not in allowed})
        if outside:
            self.error(field, f"{path}: ids {outside[:10]} are not valid here")


def parse_local_summary(answer: object, *, segment_id: int, valid_ids: Sequence[int]) -> LocalSummary:
    """Read one local summary; ids outside its own ``valid_ids`` and unknown tags are kept, as errors."""
    reader = _Reader()
    if not isinstance(answer, dict):
        reader.error("summary", "the answer is not a JSON object")
        return LocalSummary(segment_id, None, "", (), (), (), (), tuple(reader.errors))
    own = frozenset(valid_ids)
    echoed = reader.integer(answer, "segment_id", "segment_id", "segment_id")
    if echoed is not None and echoed != segment_id:
        reader.error("segment_id", f"segment_id: answered {echoed}, asked for {segment_id}")
    step_range = reader.step_range(answer, "step_range", "step_range", "step_range", own)
    goal = reader.string(answer, "segment_goal", "segment_goal", "segment_goal")

    events: list[KeyEvent] = []
    for path, item in reader.objects(answer, "key_events", "key_events", "key_events"):
        ids = reader.step_ids(item, "step_ids", "key_events", f"{path}.step_ids", own) or ()
        events.append(KeyEvent(reader.string(item, "event", "key_events", f"{path}.event") or "", ids))
    if "key_events" in answer and not 3 <= len(events) <= 8:
        reader.error("key_events", f"key_events: expected 3–8 events, got {len(events)}")

    proposals: list[StepProposal] = []
    for path, item in reader.objects(answer, "proposed_steps", "proposed_steps", "proposed_steps"):
        step_id = reader.step(item, "step_id", "proposed_steps", f"{path}.step_id")
        tags = reader.strings(item, "tags", "proposed_steps", f"{path}.tags") or ()
        note = reader.string(item, "note", "proposed_steps", f"{path}.note") or ""
        if step_id is None:
            continue
        if step_id not in own:
            reader.error("proposed_steps", f"{path}.step_id: {step_id} is not one of this segment's steps")
        unknown = [tag for tag in tags if tag not in CANDIDATE_TAGS]
        if unknown:
            reader.error("proposed_steps", f"{path}.tags: unknown tags {unknown!r}")
        if not tags:
            reader.error("proposed_steps", f"{path}.tags: no tag")
        proposals.append(StepProposal(step_id, tuple(dict.fromkeys(tags)), note))

    findings: list[VerifierFinding] = []
    for path, item in reader.objects(answer, "verifier_findings", "verifier_findings", "verifier_findings"):
        ids = reader.step_ids(item, "step_ids", "verifier_findings", f"{path}.step_ids", own) or ()
        result = reader.string(item, "result", "verifier_findings", f"{path}.result")
        reader.enum(result, VERIFIER_RESULTS, "verifier_findings", f"{path}.result")
        note = reader.string(item, "note", "verifier_findings", f"{path}.note") or ""
        findings.append(VerifierFinding(ids, result or "", note))
    uncertainties = reader.strings(answer, "uncertainties", "uncertainties", "uncertainties") or ()
    return LocalSummary(
        segment_id=segment_id,
        step_range=step_range,
        segment_goal=goal or "",
        key_events=tuple(events),
        proposals=tuple(proposals),
        verifier_findings=tuple(findings),
        uncertainties=uncertainties,
        errors=tuple(reader.errors),
    )


def parse_outline(answer: object, *, trajectory: Trajectory, segment_ids: Sequence[int]) -> Outline:
    """Read the trajectory outline; ``readable`` is False when there is no list of phase objects to read."""
    reader = _Reader()
    if not isinstance(answer, dict):
        reader.error("phases", "the answer is not a JSON object")
        return Outline((), (), readable=False, errors=tuple(reader.errors))
    steps = range(trajectory.n_steps)
    agents = frozenset(trajectory.agents)
    phases: list[Phase] = []
    for path, item in reader.objects(answer, "phases", "phases", "phases"):
        step_range = reader.step_range(item, "step_range", "phases", f"{path}.step_range", steps)
        involved = reader.strings(item, "involved_agents", "phases", f"{path}.involved_agents") or ()
        strangers = [a for a in involved if a not in agents]
        if strangers:
            reader.error("phases", f"{path}.involved_agents: {strangers!r} are not recorded agents")
        sub_phases: list[SubPhase] = []
        for sub_path, sub in reader.objects(item, "sub_phases", "phases", f"{path}.sub_phases"):
            sub_range = reader.step_range(sub, "step_range", "phases", f"{sub_path}.step_range", steps)
            text = reader.string(sub, "description", "phases", f"{sub_path}.description") or ""
            sub_phases.append(SubPhase(sub_range, text))
        signals: list[FailureSignal] = []
        for sig_path, sig in reader.objects(item, "failure_signals", "phases", f"{path}.failure_signals"):
            ids = reader.step_ids(sig, "step_ids", "phases", f"{sig_path}.step_ids", steps) or ()
            severity = reader.string(sig, "severity", "phases", f"{sig_path}.severity")
            reader.enum(severity, SEVERITIES, "phases", f"{sig_path}.severity")
            text = reader.string(sig, "description", "phases", f"{sig_path}.description") or ""
            signals.append(FailureSignal(text, ids, severity or ""))
        supporting = reader.step_ids(
            item, "supporting_step_ids", "phases", f"{path}.supporting_step_ids", steps
        )
        phases.append(
            Phase(
                phase_id=reader.integer(item, "phase_id", "phases", f"{path}.phase_id"),
                step_range=step_range,
                phase_goal=reader.string(item, "phase_goal", "phases", f"{path}.phase_goal") or "",
                involved_agents=involved,
                sub_phases=tuple(sub_phases),
                failure_signals=tuple(signals),
                supporting_step_ids=supporting or (),
            )
        )
    known_segments = frozenset(segment_ids)
    conflicts: list[Conflict] = []
    for path, item in reader.objects(answer, "conflicts", "conflicts", "conflicts"):
        segs = reader.ints(item, "segment_ids", "conflicts", f"{path}.segment_ids") or ()
        unknown = sorted({s for s in segs if s not in known_segments})
        if unknown:
            reader.error("conflicts", f"{path}.segment_ids: {unknown} are not segment ids")
        ids = reader.step_ids(item, "step_ids", "conflicts", f"{path}.step_ids", steps) or ()
        text = reader.string(item, "description", "conflicts", f"{path}.description") or ""
        conflicts.append(Conflict(text, segs, ids))
    return Outline(tuple(phases), tuple(conflicts), readable=bool(phases), errors=tuple(reader.errors))


def _read_trace(reader: _Reader, analysis: Mapping[str, Any]) -> DelegationTrace | None:
    raw = reader.get(analysis, "delegation_trace", "delegation_trace", "analysis.delegation_trace")
    if raw is _MISSING:
        return None
    if not isinstance(raw, dict):
        reader.error("delegation_trace", "analysis.delegation_trace: expected an object")
        return None
    before = len(reader.errors)
    path = "analysis.delegation_trace"
    checked = reader.boolean(raw, "checked", "delegation_trace", f"{path}.checked")
    faithful = reader.boolean(
        raw, "faithful_implementation", "delegation_trace", f"{path}.faithful_implementation"
    )
    prescribing: int | None = None
    if "prescribing_step" not in raw:
        reader.error("delegation_trace", f"{path}.prescribing_step: missing")
    elif raw["prescribing_step"] is not None:
        prescribing = reader.step(raw, "prescribing_step", "delegation_trace", f"{path}.prescribing_step")
    quote = reader.string(raw, "quote", "delegation_trace", f"{path}.quote")
    defect = reader.string(raw, "defect_in_quote", "delegation_trace", f"{path}.defect_in_quote")
    if len(reader.errors) > before or checked is None or faithful is None or quote is None or defect is None:
        return None
    return DelegationTrace(checked, faithful, prescribing, quote, defect)


def _read_chain(reader: _Reader, analysis: Mapping[str, Any]) -> tuple[ChainNode, ...] | None:
    items = reader.array(analysis, "failure_chain", "failure_chain", "analysis.failure_chain")
    if items is None:
        return None
    nodes: list[ChainNode] = []
    before = len(reader.errors)
    for position, item in enumerate(items):
        path = f"analysis.failure_chain[{position}]"
        if not isinstance(item, dict):
            reader.error("failure_chain", f"{path}: expected an object")
            continue
        step: int | None = None
        if "step" not in item:
            reader.error("failure_chain", f"{path}.step: missing")
        elif item["step"] is not None:
            step = reader.step(item, "step", "failure_chain", f"{path}.step")
        agent = reader.string(item, "agent", "failure_chain", f"{path}.agent")
        role = reader.string(item, "role", "failure_chain", f"{path}.role")
        description = reader.string(item, "description", "failure_chain", f"{path}.description")
        nodes.append(ChainNode(step, agent or "", role or "", description or ""))
    return None if len(reader.errors) > before else tuple(nodes)


def parse_attribution(answer: object) -> AttributionAnswer:
    """Read the final attribution answer; nothing is repaired (a digit-string step id is read as its integer)."""
    reader = _Reader()
    if not isinstance(answer, dict):
        for name in ("agent", "step"):
            reader.error(name, "the answer is not a JSON object")
        return AttributionAnswer(
            None, None, None, None, None, None, None, None, None, None, None, tuple(reader.errors)
        )
    agent: str | None = None
    step: int | None = None
    root = reader.get(answer, "root_cause", "agent", "root_cause")
    if root is _MISSING:
        reader.error("step", "root_cause: missing")
    elif not isinstance(root, dict):
        reader.error("agent", "root_cause: expected an object")
        reader.error("step", "root_cause: expected an object")
    else:
        agent = reader.string(root, "agent", "agent", "root_cause.agent")
        step = reader.step(root, "step", "step", "root_cause.step")
    evidence = reader.step_ids(answer, "evidence_step_ids", "evidence_step_ids", "evidence_step_ids")
    factors = reader.strings(answer, "contributing_factors", "contributing_factors", "contributing_factors")
    trace: DelegationTrace | None = None
    chain: tuple[ChainNode, ...] | None = None
    counterfactual: str | None = None
    confidence: str | None = None
    analysis = answer.get("analysis")
    if isinstance(analysis, dict):
        trace = _read_trace(reader, analysis)
        chain = _read_chain(reader, analysis)
        counterfactual = reader.string(
            analysis, "counterfactual", "counterfactual", "analysis.counterfactual"
        )
        confidence = reader.string(analysis, "confidence", "confidence", "analysis.confidence")
    else:
        problem = "missing" if "analysis" not in answer else "expected an object"
        for name in _ANALYSIS_FIELDS:
            reader.error(name, f"analysis: {problem}")
    return AttributionAnswer(
        agent=agent,
        step=step,
        reason=reader.string(answer, "reason", "reason", "reason"),
        evidence_step_ids=evidence,
        abstain=reader.boolean(answer, "abstain", "abstain", "abstain"),
        primary_category=reader.string(answer, "primary_category", "primary_category", "primary_category"),
        contributing_factors=factors,
        delegation_trace=trace,
        failure_chain=chain,
        counterfactual=counterfactual,
        confidence=confidence,
        errors=tuple(reader.errors),
    )
