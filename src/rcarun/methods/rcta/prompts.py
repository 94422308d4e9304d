"""The requests RCTA sends: each stage's messages, fitted to the backbone's window, and their pieces."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from rcarun.data import Trajectory
from rcarun.methods.context import cut_middle, fit_prompt, ground_truth_line, task_text
from rcarun.methods.llm import LLM, Message
from rcarun.methods.prompt_files import load_prompt

from .candidates import CandidatePool
from .enrich import EnrichedStep
from .evidence import Evidence
from .handoffs import HandoffLink
from .linkage import LinkageHint
from .options import Ablation, RctaOptions
from .schemas import LocalSummary, Outline, attribution_schema, scorable_agents
from .segment import Segment
from .validate import retry_feedback

__all__ = ["RctaPrompts", "stage1_feedback", "with_feedback"]

_STAGE1_FEEDBACK_ERRORS = 20  # the release appends the first 20 errors to a local/phase retry
_NOTE_CHARS = 300  # a candidate note longer than this is cut in the excerpt header

_CUT_NOTE = (
    "\nSome long step texts were cut in the middle to fit the model's context; their step ids are kept.\n"
)


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _id_ranges(ids: Sequence[int]) -> str:
    """Ids as ``"0-5, 9, 12-14"``."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    start = previous = None
    for value in [*ordered, None]:
        if value is not None and previous is not None and value == previous + 1:
            previous = value
            continue
        if start is not None and previous is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = value
    return ", ".join(parts) if parts else "(none)"


def _signal_summary(steps: Sequence[EnrichedStep]) -> str:
    """The release's verifier-signal digest: count, first PASS, first FAIL, last signal, first 20 signals."""
    signals = [(s.step_id, s.verifier_signal) for s in steps if s.verifier_signal is not None]
    if not signals:
        return "none"
    first_pass = next((i for i, sig in signals if sig == "PASS"), None)
    first_fail = next((i for i, sig in signals if sig == "FAIL"), None)
    listed = ", ".join(f"{sig}@{i}" for i, sig in signals[:20])
    return (
        f"{len(signals)} signal(s); first PASS at {first_pass}; first FAIL at {first_fail}; "
        f"last {signals[-1][1]} at {signals[-1][0]}; in order: {listed}"
    )


def _step_header(step: EnrichedStep, *, role_class: bool) -> str:
    facts: list[str] = [step.role_class] if role_class else []
    facts.append(step.action_type)
    if step.delegate_target is not None:  # Who&When keeps the recipient in the role, not in the agent name
        facts.append(f"hands off to {step.delegate_target}")
    if step.exit_code is not None:
        facts.append(f"exit code {step.exit_code}")
    if step.verifier_signal is not None:
        facts.append(f"signal {step.verifier_signal}")
    facts.append(f"{step.content_len} chars")
    return f"[step {step.step_id}] {step.agent_raw} ({'; '.join(facts)})"


def _capped(content: str, cap: int | None) -> str:
    return cut_middle(content, cap) if cap is not None and len(content) > cap else content


def _summary_json(summary: LocalSummary) -> dict[str, Any]:
    """A summary as the later prompts show it: as answered, its proposals as ``proposed_steps``."""
    fields = asdict(summary)
    del fields["errors"]
    return {"proposed_steps" if key == "proposals" else key: value for key, value in fields.items()}


def _outline_json(outline: Outline) -> dict[str, Any]:
    return {
        "phases": [asdict(p) for p in outline.phases],
        "conflicts": [asdict(c) for c in outline.conflicts],
    }


def with_feedback(messages: Sequence[Message], feedback: str) -> list[Message]:
    """The first request again, with the validation feedback appended to its last user message."""
    head, last = list(messages[:-1]), messages[-1]
    return [*head, Message(last.role, f"{last.content}\n\n{feedback}")]


def stage1_feedback(errors: Sequence[str]) -> str:
    """The note appended to a summary's or the outline's retry."""
    return retry_feedback(errors, limit=_STAGE1_FEEDBACK_ERRORS)


class RctaPrompts:
    """The prompt templates of one condition and the requests built from them."""

    def __init__(self, options: RctaOptions, flags: Ablation) -> None:
        self.options = options
        self.flags = flags
        self.budgets = options.budgets
        self._summary_system = load_prompt("rcta_summary_system.txt").template.strip()
        self._summary_user = load_prompt("rcta_summary_user.txt")
        self._outline_system = load_prompt("rcta_outline_system.txt").template.strip()
        self._outline_user = load_prompt("rcta_outline_user.txt")
        backward = (
            "\n" + load_prompt("rcta_attribution_backward.txt").template.strip()
            if flags.backward_rules
            else ""
        )
        self._attribution_system = (
            load_prompt("rcta_attribution_system.txt").substitute(backward_rules=backward).strip()
        )
        self._attribution_user = load_prompt("rcta_attribution_user.txt")

    def _content(self, step: EnrichedStep) -> str:
        return _capped(step.content, self.options.step_char_limit)

    def summary_messages(
        self, trajectory: Trajectory, seg: Segment, schema: Mapping[str, Any], llm: LLM
    ) -> tuple[list[Message], dict[str, Any]]:
        """The local-summary request of one segment, and the truncation applied to fit ``llm``'s window."""
        shown = [*seg.overlap_steps, *seg.steps]
        contents = [self._content(s) for s in shown]
        n_overlap = len(seg.overlap_steps)

        def render(cap: int | None) -> str:
            blocks = [
                f"{_step_header(s, role_class=True)}\n{_capped(c, cap)}"
                for s, c in zip(shown, contents, strict=True)
            ]
            overlap = ""
            if n_overlap:
                overlap = (
                    "\n=== CONTEXT FROM THE PREVIOUS SEGMENT (read-only; these ids must not be cited) ===\n"
                    + "\n\n".join(blocks[:n_overlap])
                    + "\n=== END OF CONTEXT ===\n"
                )
            return self._summary_user.substitute(
                task=task_text(trajectory, include=self.options.include_task),
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                segment_id=seg.segment_id,
                first=seg.step_ids[0],
                last=seg.step_ids[-1],
                n_steps=trajectory.n_steps,
                agents=", ".join(seg.agents),
                signals=", ".join(seg.verifier_signals) or "none",
                valid_ids=_id_ranges(seg.step_ids),
                overlap=overlap,
                steps="\n\n".join(blocks[n_overlap:]),
                truncation_note="" if cap is None else _CUT_NOTE,
                schema=compact(schema),
            )

        return self._fitted(render, contents, llm, self.budgets.summary, self._summary_system)

    def outline_messages(
        self,
        trajectory: Trajectory,
        enriched: Sequence[EnrichedStep],
        summaries: Sequence[LocalSummary],
        schema: Mapping[str, Any],
    ) -> list[Message]:
        """The trajectory-outline request (summaries are short; no truncation is applied)."""
        user = self._outline_user.substitute(
            task=task_text(trajectory, include=self.options.include_task),
            ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
            n_steps=trajectory.n_steps,
            valid_ids=_id_ranges(range(trajectory.n_steps)),
            n_segments=len(summaries),
            agents=", ".join(trajectory.agents),
            signals=_signal_summary(enriched),
            summaries="\n".join(compact(_summary_json(s)) for s in summaries),
            schema=compact(schema),
        )
        return [Message("system", self._outline_system), Message("user", user)]

    def _excerpt_label(
        self, step_id: int, pool: CandidatePool, base: frozenset[int], links: Sequence[HandoffLink]
    ) -> list[str]:
        """Annotation lines under an excerpt's header, by condition."""
        lines: list[str] = []
        if step_id in base and self.flags.stage_one_cues:
            candidate = next((c for c in pool.candidates if c.step_id == step_id), None)
            if candidate is not None:
                notes = "; ".join(n[:_NOTE_CHARS] for n in candidate.notes) or "-"
                lines.append(
                    f"candidate: tags {', '.join(candidate.tags) or '-'}; "
                    f"proposed by {', '.join(candidate.proposed_by)}; notes: {notes}"
                )
        receivers = [link.candidate for link in links if link.handoff == step_id]
        if receivers:
            if not self.flags.handoff_labels:
                lines.append("CONTEXT: an earlier step shown for context.")
            else:
                lines.append(
                    "HANDOFF INSTRUCTION: the logged instruction preceding candidate step(s) "
                    f"{', '.join(map(str, receivers))}; it is their specification source, so check it first."
                )
        return lines

    def _excerpt_guide(self) -> str:
        if not self.flags.stage_one_cues:
            return "Each excerpt is one step's original text with its id."
        proposed = (
            "Each excerpt is one step's original text with its id. Steps proposed by the summaries (local:<segment>) "
            "or the outline (outline:<phase>) carry their tags, who proposed them and their notes."
        )
        if not self.flags.handoff_labels:
            return f"{proposed} Steps marked CONTEXT are shown as further context."
        if not self.flags.handoff_evidence:
            return proposed
        return (
            f"{proposed} A HANDOFF INSTRUCTION is the logged instruction that preceded the candidates it names; "
            "compare them with it."
        )

    @staticmethod
    def _hints_text(hints: Sequence[LinkageHint]) -> str:
        if not hints:
            return ""
        lines = [
            "=== LINKAGE HINTS (rule-based; they only direct attention) ===",
            "Each hint says that an executor step may carry out the handoff instruction addressed to it. "
            "Trace the root back to the instruction only if the executor copied the same defect; a weak hint "
            "means overlapping scope only.",
        ]
        for hint in hints:
            evidence = (
                f'cites the plan ("{hint.cites_plan}")'
                if hint.cites_plan is not None
                else f"shares {hint.shared_count} code identifiers ({', '.join(hint.shared_identifiers)})"
            )
            lines.append(
                f"- step {hint.executor_step} ({hint.executor_agent}) may implement handoff step "
                f"{hint.handoff_step} ({hint.handoff_agent} -> {hint.handoff_recipient}): {evidence}; "
                f"{hint.strength} hint, identifier overlap {hint.overlap}"
            )
        return "\n".join(lines) + "\n"

    def attribution_messages(
        self,
        trajectory: Trajectory,
        enriched: Sequence[EnrichedStep],
        summaries: Sequence[LocalSummary],
        outline: Outline,
        evidence: Evidence,
        schema: Mapping[str, Any],
        llm: LLM,
    ) -> tuple[list[Message], dict[str, Any]]:
        """The final attribution request, and the truncation applied to its excerpts."""
        base = frozenset(evidence.base_ids)
        shown = [enriched[i] for i in evidence.excerpt_ids]
        contents = [self._content(s) for s in shown]
        labels = [self._excerpt_label(s.step_id, evidence.pool, base, evidence.links) for s in shown]
        role_classes = self.flags.role_classes
        if not self.flags.stage_one_cues:
            masked = "(not provided in this condition)"
            outline_text = summaries_text = masked
        else:
            outline_text = compact(_outline_json(outline))
            if outline.fallback:
                outline_text = (
                    "(the outline could not be built; one phase per segment summary)\n" + outline_text
                )
            summaries_text = "\n".join(compact(_summary_json(s)) for s in summaries)

        def render(cap: int | None) -> str:
            blocks = [
                "\n".join([_step_header(s, role_class=role_classes), *label, _capped(c, cap)])
                for s, c, label in zip(shown, contents, labels, strict=True)
            ]
            return self._attribution_user.substitute(
                task=task_text(trajectory, include=self.options.include_task),
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                agents=", ".join(scorable_agents(trajectory)),
                n_steps=trajectory.n_steps,
                last_step=trajectory.n_steps - 1,
                outline=outline_text,
                summaries=summaries_text,
                hints=self._hints_text(evidence.hints),
                excerpt_guide=self._excerpt_guide(),
                excerpts="\n\n".join(blocks) if blocks else "(no excerpts)",
                truncation_note="" if cap is None else _CUT_NOTE,
                schema=compact(schema),
            )

        return self._fitted(render, contents, llm, self.budgets.attribution, self._attribution_system)

    def _fitted(
        self,
        render: Callable[[int | None], str],
        contents: Sequence[str],
        llm: LLM,
        max_tokens: int,
        system: str,
    ) -> tuple[list[Message], dict[str, Any]]:
        """The system prompt and the user prompt cut by the shared context policy, with what was cut."""
        fitted = fit_prompt(
            render,
            [len(c) for c in contents],
            llm=llm,
            max_tokens=max_tokens,
            system=system,
            policy=self.options.truncation,
        )
        return [Message("system", system), Message("user", fitted.text)], fitted.truncation.as_output()

    def attribution_schema(self, trajectory: Trajectory) -> dict[str, Any]:
        """The attribution answer's schema; without the A3 flags it asks no instruction evidence."""
        schema = attribution_schema(trajectory)
        if self.flags.delegation_trace:
            return schema
        # The A3 control asks for no instruction evidence: delegation_trace leaves the schema.
        analysis = dict(schema["properties"]["analysis"])
        properties = {k: v for k, v in analysis["properties"].items() if k != "delegation_trace"}
        analysis.update(properties=properties, required=list(properties))
        return {**schema, "properties": {**schema["properties"], "analysis": analysis}}
