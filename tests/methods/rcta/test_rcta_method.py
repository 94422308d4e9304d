"""The RCTA pipeline against a routed scripted LLM: call structure, A1–A4 controls, shared Stage I, outputs."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rcarun.data import Step, Trajectory, iter_dataset
from rcarun.errors import ConfigError
from rcarun.methods import Message, Reply, create_method
from rcarun.methods.rcta.method import PRESET_REASONING, PRESETS, RCTA, RctaOptions, uniform_ids
from rcarun.methods.rcta.options import ABLATIONS, Ablation

# --- a routed scripted LLM --------------------------------------------------------------------------------

Route = Callable[["Request"], Any]


@dataclass(frozen=True)
class Request:
    stage: str
    messages: tuple[Message, ...]
    max_tokens: int
    schema: Mapping[str, Any] | None
    temperature: float | None
    reasoning: str | None

    @property
    def user(self) -> str:
        return self.messages[-1].content

    @property
    def system(self) -> str:
        return self.messages[0].content


@dataclass
class RoutedLLM:
    """Answers each request with ``routes[stage](request)``: a JSON value (dumped) or a raw string."""

    routes: Mapping[str, Route]
    context_window: int | None = None
    requests: list[Request] = field(default_factory=list)

    def estimate_tokens(self, text: str) -> int:
        return len(text) // 4 + 1

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        stage: str,
        max_tokens: int,
        schema: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        reasoning: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Reply:
        request = Request(stage, tuple(messages), max_tokens, schema, temperature, reasoning)
        self.requests.append(request)
        answer = self.routes[stage](request)
        text = answer if isinstance(answer, str) else json.dumps(answer)
        try:
            parsed, error = json.loads(text), None
        except json.JSONDecodeError as exc:
            parsed, error = None, str(exc)
        return Reply(text=text, parsed=parsed, parse_error=error, finish_reason="stop")

    def stages(self) -> list[str]:
        return [r.stage for r in self.requests]


def instance(schema: Mapping[str, Any]) -> Any:
    """A value that satisfies ``schema`` (the subset our stage schemas use); arrays get max(minItems, 1) items."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        return {key: instance(sub) for key, sub in schema["properties"].items()}
    if kind == "array":
        return [instance(schema["items"]) for _ in range(max(schema.get("minItems", 0), 1))]
    if kind == "integer":
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return "text"


def answer(
    agent: str,
    step: int,
    *,
    evidence: Sequence[int] | None = None,
    category: str = "D1",
    trace: Mapping[str, Any] | None = None,
    abstain: bool = False,
) -> dict[str, Any]:
    """A valid attribution answer (for a non-planner agent, or a planner pointing at a planner step)."""
    analysis: dict[str, Any] = {
        "delegation_trace": dict(
            trace
            or {
                "checked": False,
                "faithful_implementation": False,
                "prescribing_step": None,
                "quote": "",
                "defect_in_quote": "",
            }
        ),
        "failure_chain": [
            {"step": step, "agent": agent, "role": "root_cause", "description": "root"},
            {"step": None, "agent": agent, "role": "terminal", "description": "evaluation"},
        ],
        "counterfactual": "had this step been right, the run would have succeeded",
        "confidence": "low" if abstain else "medium",
    }
    return {
        "root_cause": {"agent": agent, "step": step},
        "reason": "because",
        "evidence_step_ids": list(evidence if evidence is not None else [step]),
        "abstain": abstain,
        "primary_category": category,
        "contributing_factors": [],
        "analysis": analysis,
    }


def summary_for(proposals: Callable[[list[int]], list[dict[str, Any]]] | None = None) -> Route:
    """A valid local summary built from the request's schema; ``proposals(own_ids)`` chooses the proposals."""

    def route(request: Request) -> dict[str, Any]:
        assert request.schema is not None
        value = instance(request.schema)
        own = request.schema["properties"]["proposed_steps"]["items"]["properties"]["step_id"]["enum"]
        value["step_range"] = [own[0], own[-1]]
        value["key_events"] = [{"event": "e", "step_ids": [own[0]]}] * 3
        value["proposed_steps"] = proposals(own) if proposals else []
        return value

    return route


def outline_with(signals: Sequence[int] = (), supporting: Sequence[int] = (), *, phases: int = 3) -> Route:
    """An outline of ``phases`` phases; the first carries a failure signal on ``signals`` and ``supporting``."""

    def route(request: Request) -> Any:
        assert request.schema is not None
        value = instance(request.schema)
        phase = value["phases"][0]
        value["phases"] = [
            {**phase, "phase_id": i + 1, "failure_signals": [], "supporting_step_ids": []}
            for i in range(phases)
        ]
        if signals:
            value["phases"][0]["failure_signals"] = [
                {"description": "late failure", "step_ids": list(signals), "severity": "high"}
            ]
        value["phases"][0]["supporting_step_ids"] = list(supporting)
        return value

    return route


outline_route = outline_with()  # no step hints: the candidates are the summaries' proposals


# --- a hand-made Magentic-One style trajectory ---------------------------------------------------------------

PLAN = "Search the web for the 2019 price list and report the price in euros using parse_config settings."
TASK = "What did the product cost in 2019?"


def _step(index: int, role: str, content: str) -> Step:
    agent = re.sub(r"\s*\([^()]*\)\s*$", "", role)
    return Step(index=index, agent=agent, role=role, content=content)


def magentic() -> Trajectory:
    """12 steps; handoffs at 1 (-> WebSurfer), 4 (-> Coder), 7 (-> Coder), 10 (-> WebSurfer)."""
    rows = [
        ("human", TASK),
        ("Orchestrator (-> WebSurfer)", PLAN),
        ("WebSurfer", "I searched as instructed and found a price of 40 dollars."),
        ("Orchestrator (thought)", "The price is in dollars; we need euros."),
        ("Orchestrator (-> Coder)", "Convert 40 dollars to euros with rate 0.5."),
        ("Coder", "```python\nprint(40 * 0.5)\n```"),
        ("ComputerTerminal", "exitcode: 0\n20.0"),
        ("Orchestrator (-> Coder)", "Double-check the conversion."),
        ("Coder", "The conversion is right."),
        ("ComputerTerminal", "exitcode: 0"),
        ("Orchestrator (-> WebSurfer)", "Confirm the year of the price list."),
        ("WebSurfer", "FINAL ANSWER: 20 euros."),
    ]
    steps = tuple(_step(i, role, content) for i, (role, content) in enumerate(rows))
    return Trajectory(qid="hand/1", source="hand_crafted", task=TASK, steps=steps, sha256="0" * 64)


SMALL = {"max_steps": 4}  # 12 steps -> 3 segments of 4 (semantic cuts need 10,000 characters)


def rcta(name: str = "rcta", **options: Any) -> RCTA:
    options.setdefault("segmentation", SMALL)
    made = create_method(name, options=options)
    assert isinstance(made, RCTA)
    return made


def propose(*ids_tags: tuple[int, str]) -> Callable[[list[int]], list[dict[str, Any]]]:
    def proposals(own: list[int]) -> list[dict[str, Any]]:
        return [{"step_id": i, "tags": [t], "note": f"note {i}"} for i, t in ids_tags if i in own]

    return proposals


def llm_with(
    attribution: Route, proposals: Callable[[list[int]], list[dict[str, Any]]] | None = None
) -> RoutedLLM:
    return RoutedLLM(
        {"summary": summary_for(proposals), "outline": outline_route, "attribution": attribution}
    )


def attribution_user(llm: RoutedLLM, index: int = 0) -> str:
    return [r for r in llm.requests if r.stage == "attribution"][index].user


def excerpt_ids_in(prompt: str) -> list[int]:
    section = prompt.split("=== EVIDENCE EXCERPTS ===")[1].split("=== END OF EXCERPTS ===")[0]
    return [int(m) for m in re.findall(r"^\[step (\d+)\]", section, flags=re.MULTILINE)]


# --- registration and options ------------------------------------------------------------------------------


def test_registered_names_fix_their_ablation_and_label() -> None:
    for name, ablation in [("rcta", None), ("rcta/no-a1", "no-a1"), ("rcta/no-a4", "no-a4")]:
        made = rcta(name)
        assert made.label == name
        assert made.ablation == ablation
    assert rcta("rcta", ablation="no-a2").ablation == "no-a2"
    assert rcta("rcta/no-a3", ablation="no-a3").ablation == "no-a3"
    assert RCTA.shareable_stages == frozenset({"summary", "outline"})


def test_every_ablation_name_resolves_to_the_flags_the_docs_table_gives() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "methods" / "rcta.md").read_text(encoding="utf-8")
    header = next(line for line in doc.splitlines() if line.startswith("| flag |"))
    conditions = [cell.strip() for cell in header.strip("|").split("|")][2:]
    assert conditions == ["full", *ABLATIONS]
    rows = [line for line in doc.splitlines() if re.match(r"\| `\w+` \| .* \| (on|off) \|$", line)]
    table = {
        row.split("|")[1].strip(" `"): [cell.strip() == "on" for cell in row.strip("|").split("|")[2:]]
        for row in rows
    }
    flags = [f.name for f in dataclasses.fields(Ablation)]
    assert sorted(table) == sorted(flags)
    for column, name in enumerate([None, *ABLATIONS]):
        resolved = Ablation.of(name)
        assert {flag: getattr(resolved, flag) for flag in flags} == {
            flag: table[flag][column] for flag in flags
        }
        if name is not None:
            assert rcta(f"rcta/{name}").flags == resolved


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("rcta", {"bogus": 1}, r"rcta: unknown option\(s\) \['bogus'\]"),
        ("rcta", {"preset": "huge"}, r"rcta: preset: Input should be 'full' or 'ablation' \(got 'huge'\)"),
        ("rcta", {"ablation": "no-a5"}, r"rcta: ablation: Input should be 'no-a1', .* \(got 'no-a5'\)"),
        ("rcta/no-a1", {"ablation": "no-a2"}, r"rcta/no-a1: ablation is fixed to 'no-a1'; got 'no-a2'"),
        ("rcta/no-a2", {"bogus": 1}, r"rcta/no-a2: unknown option\(s\) \['bogus'\]"),
        (
            "rcta",
            {"segmentation": {"max_step": 3}},
            r"rcta: unknown segmentation field\(s\) \['max_step'\]; known: \[",
        ),
        (
            "rcta",
            {"segmentation": {"max_steps": 0}},
            r"rcta: segmentation: max_steps must be at least 1, got 0",
        ),
        ("rcta", {"segmentation": {"max_steps": True}}, r"rcta: segmentation\.max_steps: .*valid integer"),
        ("rcta", {"segmentation": [("max_steps", 3)]}, r"rcta: segmentation: .*valid dictionary"),
        ("rcta", {"candidate_cap": 0}, r"rcta: candidate_cap: Input should be greater than 0 \(got 0\)"),
        ("rcta", {"truncation": "cut"}, r"rcta: truncation: Input should be 'cap-steps' or 'none'"),
    ],
)
def test_bad_options_are_config_errors(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        create_method(name, options=options)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("candidate_cap", "80"),
        ("candidate_cap", True),
        ("candidate_cap", 80.0),
        ("step_char_limit", float("inf")),
        ("stage1_retry", 1),
        ("ablation", "none"),
        ("candidates", 80),
    ],
)
def test_mistyped_options_are_refused_naming_the_option(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^rcta: .*{option}"):
        create_method("rcta", options={option: value})


def test_segmentation_overrides_reach_the_segmenter() -> None:
    options = RctaOptions.from_mapping({"segmentation": {"max_steps": 5, "overlap_steps": 0}})
    config = options.segmentation_config()
    assert (config.max_steps, config.overlap_steps) == (5, 0)
    assert (
        RctaOptions.from_mapping({}).segmentation_config()
        == RctaOptions.from_mapping({"segmentation": {}}).segmentation_config()
    )


def test_uniform_ids_are_centred_in_equal_bins() -> None:
    assert uniform_ids(12, 3) == (2, 6, 10)
    assert uniform_ids(10, 4) == (1, 3, 6, 8)
    assert uniform_ids(3, 5) == (0, 1, 2)
    assert uniform_ids(7, 0) == ()


# --- call structure -----------------------------------------------------------------------------------------


async def test_m_plus_two_calls_with_stage_settings_and_a_valid_answer() -> None:
    llm = llm_with(
        lambda r: answer("Coder", 5), propose((5, "possible_root"), (11, "possible_manifestation"))
    )
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages() == ["summary", "summary", "summary", "outline", "attribution"]
    assert [(r.reasoning, r.temperature) for r in llm.requests] == [
        ("off", 0.1),
        ("off", 0.1),
        ("off", 0.1),
        ("high", 0.1),
        ("high", 0.0),
    ]
    assert (result.pred_role, result.pred_step, result.role_valid, result.step_valid) == (
        "Coder",
        5,
        True,
        True,
    )
    assert not result.abstained
    out = result.output
    assert out["calls"] == 5
    assert [(s["steps"], s["overlap"], s["cut"]) for s in out["segments"]] == [
        ([0, 3], [], "max_steps"),
        ([4, 7], [0, 1, 2, 3], "max_steps"),
        ([8, 11], [4, 5, 6, 7], "end_of_trace"),
    ]
    assert out["covered"] and not out["needs_review"]
    assert out["preset"] == "full" and out["ablation"] is None
    assert [a["attempt"] for a in out["stages"]["attribution"]] == ["first"]
    # the summary of a later segment shows its overlap as context but may cite only its own steps
    second = llm.requests[1]
    assert second.schema is not None
    assert second.schema["properties"]["proposed_steps"]["items"]["properties"]["step_id"]["enum"] == [
        4,
        5,
        6,
        7,
    ]
    assert "CONTEXT FROM THE PREVIOUS SEGMENT" in second.user and "[step 3] Orchestrator" in second.user
    assert TASK in second.user


@pytest.mark.parametrize(
    ("preset", "budgets"), [("full", [4000, 6000, 8000]), ("ablation", [4000, 12000, 32000])]
)
async def test_presets_set_each_stage_budget(preset: str, budgets: list[int]) -> None:
    llm = llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    result = await rcta(preset=preset).attribute(magentic(), llm)
    assert [r.max_tokens for r in llm.requests] == [budgets[0]] * 3 + budgets[1:]
    assert result.output["preset"] == preset
    assert PRESETS[preset].attribution == budgets[2]


async def test_one_validation_retry_carries_the_feedback_and_merges_fields() -> None:
    # first attempt: valid role, step out of range; retry: unrecorded role, valid step -> both valid fields kept
    replies = iter([answer("Coder", 99, evidence=[5]), answer("Nobody", 5)])
    llm = llm_with(lambda r: next(replies), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages() == ["summary"] * 3 + ["outline", "attribution", "attribution"]
    retry = attribution_user(llm, 1)
    assert retry.startswith(attribution_user(llm, 0))
    assert "did not pass validation" in retry and "root_cause.step: 99" in retry
    assert (result.pred_role, result.pred_step, result.role_valid, result.step_valid) == (
        "Coder",
        5,
        True,
        True,
    )
    out = result.output
    assert out["calls"] == 6
    assert out["field_sources"]["agent"] == "first" and out["field_sources"]["step"] == "retry"
    assert [a["valid"] for a in out["stages"]["attribution"]] == [False, False]
    assert any("root_cause.agent: 'Nobody'" in e for e in out["stages"]["attribution"][1]["errors"])
    assert not result.abstained


async def test_unparseable_answers_abstain_and_flag_review() -> None:
    llm = llm_with(lambda r: "I cannot tell.", propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages()[-2:] == ["attribution", "attribution"]
    assert result.abstained and result.pred_role is None and result.pred_step is None
    assert not result.role_valid and not result.step_valid
    out = result.output
    assert out["needs_review"] and not out["covered"]
    assert "abstain_missing_fields" in out["diagnostics"]["fallbacks"]


async def test_model_abstention_is_kept() -> None:
    llm = llm_with(lambda r: answer("Coder", 5, evidence=[], abstain=True), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert result.abstained and result.output["model_abstained"]
    assert llm.stages().count("attribution") == 1


async def test_role_is_read_from_the_agent_field_not_the_speaker() -> None:
    # step 5 is spoken by Coder; the answer blames WebSurfer (an executor, so no planner consistency rule)
    llm = llm_with(lambda r: answer("WebSurfer", 5), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert (result.pred_role, result.pred_step) == ("WebSurfer", 5)
    assert result.role_valid


async def test_unreadable_outline_falls_back_and_is_recorded() -> None:
    routes: dict[str, Route] = {
        "summary": summary_for(propose((5, "possible_root"))),
        "outline": lambda r: "not json",
        "attribution": lambda r: answer("Coder", 5),
    }
    llm = RoutedLLM(routes)
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages() == ["summary"] * 3 + ["outline", "attribution"]  # no retry for an unreadable outline
    out = result.output
    assert out["stages"]["outline"]["fallback"] and out["stages"]["outline"]["phases"] == 3
    assert out["diagnostics"]["fallbacks"] == ["outline"]
    assert "the outline could not be built" in attribution_user(llm)


async def test_stage1_answers_with_errors_are_retried_once() -> None:
    bad_done: set[int] = set()

    def summary(request: Request) -> Any:
        value = summary_for(propose((5, "possible_root")))(request)
        own = value["step_range"]
        if own[0] == 4 and 4 not in bad_done:  # segment 1 first cites a step of segment 0
            bad_done.add(4)
            value["proposed_steps"] = [{"step_id": 2, "tags": ["possible_root"], "note": "x"}]
        return value

    outline_calls: list[int] = []

    def outline(request: Request) -> Any:
        outline_calls.append(1)
        value = outline_route(request)
        if len(outline_calls) == 1:
            value["phases"][0]["step_range"] = [5, 2]
        return value

    llm = RoutedLLM({"summary": summary, "outline": outline, "attribution": lambda r: answer("Coder", 5)})
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages() == ["summary", "summary", "summary", "summary", "outline", "outline", "attribution"]
    assert (
        "did not pass validation" in llm.requests[2].user
        and "not one of this segment" in llm.requests[2].user
    )
    records = result.output["stages"]["summary"]
    assert records[1]["retried"] and records[1]["used"] == "retry"
    assert result.output["stages"]["outline"]["used"] == "retry"
    assert result.output["candidates"]["base_ids"] == [5]


async def test_without_stage1_retry_out_of_segment_proposals_are_dropped() -> None:
    def summary(request: Request) -> Any:
        value = summary_for()(request)
        if value["step_range"][0] == 4:
            value["proposed_steps"] = [
                {"step_id": 2, "tags": ["possible_root"], "note": "x"},
                {"step_id": 6, "tags": ["possible_root"], "note": "y"},
            ]
        return value

    llm = RoutedLLM(
        {"summary": summary, "outline": outline_route, "attribution": lambda r: answer("Coder", 5)}
    )
    result = await rcta(stage1_retry=False).attribute(magentic(), llm)
    assert llm.stages().count("summary") == 3
    assert result.output["stages"]["summary"][1]["dropped_ids"] == [2]
    assert result.output["candidates"]["base_ids"] == [6]


# --- candidates, excerpts and handoffs --------------------------------------------------------------------


async def test_candidate_pool_feeds_the_excerpts_with_handoffs_and_hints() -> None:
    llm = llm_with(
        lambda r: answer("Coder", 5),
        propose((2, "possible_root"), (5, "possible_manifestation"), (11, "terminal_context")),
    )
    result = await rcta().attribute(magentic(), llm)
    out = result.output
    assert out["candidates"]["base_ids"] == [2, 5, 11]
    # WebSurfer@2 <- handoff 1, Coder@5 <- handoff 4, WebSurfer@11 <- handoff 10 (recipient matches)
    assert out["handoff_links"] == [[2, 1, "recipient"], [5, 4, "recipient"], [11, 10, "recipient"]]
    assert out["excerpt_ids"] == [1, 2, 4, 5, 10, 11]
    prompt = attribution_user(llm)
    assert excerpt_ids_in(prompt) == [1, 2, 4, 5, 10, 11]
    assert PLAN in prompt  # original text of the handoff
    assert "[step 1] Orchestrator (planner; delegate; hands off to WebSurfer;" in prompt
    assert "HANDOFF INSTRUCTION: the logged instruction preceding candidate step(s) 2" in prompt
    assert "candidate: tags possible_root; proposed by local:0; notes: note 2" in prompt
    # WebSurfer@2 says "as instructed": a linkage hint to handoff 1
    assert out["linkage_hints"] == [{"executor": 2, "handoff": 1, "kind": "cites_plan", "overlap": 0.0}]
    assert "LINKAGE HINTS" in prompt and "step 2 (WebSurfer) may implement handoff step 1" in prompt
    assert "Backward instruction-execution reasoning" in llm.requests[-1].system
    assert out["diagnostics"] == {
        "base_candidate_ids": [2, 5, 11],
        "summary_candidate_ids": [2, 5, 11],
        "outline_candidate_ids": [],
        "excerpt_ids": [1, 2, 4, 5, 10, 11],
        "evidence_ids": [5],
        "used_handoff": False,
        "outline_phases": 3,
        "outline_phases_in_range": True,
        "outline_fallback": False,
        "fallbacks": [],
    }


async def test_candidate_cap_limits_the_base_candidates() -> None:
    every = propose(*[(i, "possible_root" if i % 2 else "possible_manifestation") for i in range(12)])
    llm = llm_with(lambda r: answer("Coder", 5), every)
    result = await rcta(candidate_cap=3).attribute(magentic(), llm)
    out = result.output
    # manifestations (even ids) rank first; ties by ascending id
    assert out["candidates"]["base_ids"] == [0, 2, 4]
    assert out["candidates"]["overflow"] == 9
    assert out["diagnostics"]["base_candidate_ids"] == [0, 2, 4]
    # human@0 has no earlier handoff; WebSurfer@2 <- 1; handoff 4 (Orchestrator, "any") <- 1
    assert out["excerpt_ids"] == [0, 1, 2, 4]


async def test_faithful_instruction_root_is_validated_and_marked_as_handoff_use() -> None:
    trace = {
        "checked": True,
        "faithful_implementation": True,
        "prescribing_step": 4,
        "quote": "Convert 40 dollars to euros with rate 0.5",
        "defect_in_quote": "wrong exchange rate",
    }
    llm = llm_with(
        lambda r: answer("Orchestrator", 4, category="C1", trace=trace), propose((5, "possible_root"))
    )
    result = await rcta().attribute(magentic(), llm)
    assert (result.pred_role, result.pred_step, result.role_valid) == ("Orchestrator", 4, True)
    assert llm.stages().count("attribution") == 1
    assert result.output["covered"]
    assert result.output["diagnostics"]["used_handoff"] is True


async def test_ungrounded_quote_triggers_the_retry() -> None:
    trace = {
        "checked": True,
        "faithful_implementation": True,
        "prescribing_step": 4,
        "quote": "use the rate from the central bank website",
        "defect_in_quote": "x",
    }
    replies = iter([answer("Orchestrator", 4, category="C1", trace=trace), answer("Coder", 5)])
    llm = llm_with(lambda r: next(replies), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages().count("attribution") == 2
    assert "not found in the logged instruction of handoff step 4" in attribution_user(llm, 1)
    assert (result.pred_role, result.pred_step) == ("Coder", 5)


# --- component controls -----------------------------------------------------------------------------------


async def test_no_a2_sends_no_handoff_evidence() -> None:
    llm = llm_with(lambda r: answer("Coder", 5), propose((2, "possible_root"), (5, "possible_manifestation")))
    result = await rcta("rcta/no-a2").attribute(magentic(), llm)
    out = result.output
    assert out["excerpt_ids"] == [2, 5] and out["handoff_links"] == [] and out["linkage_hints"] == []
    prompt = attribution_user(llm)
    assert excerpt_ids_in(prompt) == [2, 5]
    assert "HANDOFF INSTRUCTION" not in prompt and PLAN not in prompt.split("=== EVIDENCE EXCERPTS ===")[1]
    assert "LINKAGE HINTS" not in prompt
    assert out["diagnostics"]["excerpt_ids"] == [2, 5] and out["ablation"] == "no-a2"


async def test_no_a3_keeps_excerpts_but_drops_backward_reasoning() -> None:
    full_llm = llm_with(
        lambda r: answer("Coder", 5), propose((2, "possible_root"), (5, "possible_manifestation"))
    )
    await rcta().attribute(magentic(), full_llm)

    def no_trace(request: Request) -> dict[str, Any]:
        value = answer("Coder", 5)
        del value["analysis"]["delegation_trace"]
        return value

    llm = llm_with(no_trace, propose((2, "possible_root"), (5, "possible_manifestation")))
    result = await rcta("rcta/no-a3").attribute(magentic(), llm)
    request = next(r for r in llm.requests if r.stage == "attribution")
    assert excerpt_ids_in(request.user) == excerpt_ids_in(attribution_user(full_llm)) == [1, 2, 4, 5]
    assert PLAN in request.user
    assert "Backward instruction-execution reasoning" not in request.system
    assert "faithfully" not in request.system and "delegation_trace" not in request.system
    assert "LINKAGE HINTS" not in request.user and "HANDOFF INSTRUCTION" not in request.user
    assert "CONTEXT: an earlier step shown for context." in request.user
    assert "(executor;" not in request.user and "(executor;" in attribution_user(full_llm)  # no role hints
    assert request.schema is not None
    assert "delegation_trace" not in request.schema["properties"]["analysis"]["properties"]
    assert "delegation_trace" not in request.user.split("=== END OF EXCERPTS ===")[1]
    # no instruction-evidence check: the answer without a trace is valid and covered, no retry
    assert llm.stages().count("attribution") == 1
    assert result.output["covered"] and (result.pred_role, result.pred_step) == ("Coder", 5)


async def test_no_a4_keeps_the_first_answer_without_retry_or_sanitising() -> None:
    llm = llm_with(lambda r: answer("Nobody", 99), propose((5, "possible_root")))
    result = await rcta("rcta/no-a4").attribute(magentic(), llm)
    assert llm.stages().count("attribution") == 1
    assert (result.pred_role, result.pred_step) == ("Nobody", 99)
    assert not result.role_valid and not result.step_valid and not result.abstained
    out = result.output
    assert not out["covered"] and out["stages"]["attribution"][0]["valid"] is False
    assert out["raw_answer"] == {"agent": "Nobody", "step": 99, "abstain": False}


async def test_no_a1_uses_equally_many_uniform_excerpts_with_masked_cues() -> None:
    proposals = propose((2, "possible_root"), (5, "possible_manifestation"), (11, "terminal_context"))
    llm = llm_with(lambda r: answer("Coder", 5), proposals)
    result = await rcta("rcta/no-a1").attribute(magentic(), llm)
    out = result.output
    assert out["candidates"]["pooled_ids"] == [2, 5, 11]
    assert out["candidates"]["base_ids"] == [2, 6, 10] == list(uniform_ids(12, 3))
    # A2 still applies: ComputerTerminal@6 and Orchestrator@10 are "any" candidates -> nearest earlier handoffs
    assert out["excerpt_ids"] == [1, 2, 4, 6, 7, 10]
    prompt = attribution_user(llm)
    assert excerpt_ids_in(prompt) == out["excerpt_ids"]
    assert "candidate: tags" not in prompt and "proposed by local" not in prompt and "note 2" not in prompt
    assert '"segment_goal"' not in prompt and '"phases"' not in prompt
    assert prompt.count("(not provided in this condition)") == 2
    assert out["diagnostics"]["base_candidate_ids"] == [2, 6, 10]


async def test_stage1_requests_are_identical_across_all_conditions() -> None:
    proposals = propose((2, "possible_root"), (5, "possible_manifestation"), (11, "terminal_context"))
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for name in ["rcta", "rcta/no-a1", "rcta/no-a2", "rcta/no-a3", "rcta/no-a4"]:
        llm = llm_with(lambda r: answer("Coder", 5), proposals)
        made = rcta(name, preset="ablation")
        assert made.shareable_stages == frozenset({"summary", "outline"})
        await made.attribute(magentic(), llm)
        seen[name] = [
            (
                r.stage,
                r.messages,
                json.dumps(r.schema, sort_keys=True),
                r.max_tokens,
                r.temperature,
                r.reasoning,
            )
            for r in llm.requests
            if r.stage in made.shareable_stages
        ]
    reference = seen["rcta"]
    assert len(reference) == 4
    for name, requests in seen.items():
        assert requests == reference, name


# --- Who&When hand-crafted and the bundled sample --------------------------------------------------------

DIAGNOSTICS_KEYS = {
    "base_candidate_ids",
    "summary_candidate_ids",
    "outline_candidate_ids",
    "excerpt_ids",
    "evidence_ids",
    "used_handoff",
    "outline_phases",
    "outline_phases_in_range",
    "outline_fallback",
    "fallbacks",
}


def _valid_attribution(trajectory: Trajectory) -> Route:
    def route(request: Request) -> dict[str, Any]:
        ids = excerpt_ids_in(request.user) or [trajectory.n_steps - 1]
        step = ids[-1]
        agent = trajectory.steps[step].agent
        planner = agent == "Orchestrator"
        return answer(agent, step, category="C1" if planner else "D1")

    return route


async def test_full_pipeline_on_every_who_and_when_hand_crafted_file(who_and_when: Path) -> None:
    records = [r for r in iter_dataset(who_and_when) if r.trajectory.source == "hand_crafted"]
    assert records
    for record in records:
        trajectory = record.trajectory
        proposals = propose(*[(i, "possible_root") for i in range(0, trajectory.n_steps, 3)])
        for name in ["rcta", "rcta/no-a1", "rcta/no-a3"]:
            llm = RoutedLLM(
                {
                    "summary": summary_for(proposals),
                    "outline": outline_route,
                    "attribution": _valid_attribution(trajectory),
                },
                context_window=200_000,
            )
            made = create_method(name)
            result = await made.attribute(trajectory, llm)
            m = len(result.output["segments"])
            assert llm.stages() == ["summary"] * m + ["outline", "attribution"], (trajectory.qid, name)
            assert result.role_valid and result.step_valid and not result.abstained, (trajectory.qid, name)
            assert set(result.output["diagnostics"]) == DIAGNOSTICS_KEYS


async def test_long_steps_are_capped_to_fit_the_context_window() -> None:
    long = magentic()
    steps = list(long.steps)
    steps[5] = Step(5, "Coder", "Coder", "x" * 40_000)
    trajectory = Trajectory("long/1", "hand_crafted", TASK, tuple(steps), "0" * 64)
    llm = llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    llm.context_window = 12_000
    result = await rcta().attribute(trajectory, llm)
    out = result.output
    assert out["truncation"]["applied"] and out["truncation"]["fits"]
    # step 5 is over the 32,000-character segment cap: its own segment, whose summary prompt is cut
    (own,) = [s for s in out["segments"] if s["steps"] == [5, 5]]
    assert out["stages"]["summary"][own["id"]]["truncation"]["applied"]
    assert all(llm.estimate_tokens(r.user) < 12_000 - r.max_tokens for r in llm.requests)
    assert "characters elided" in attribution_user(llm)


def test_options_defaults() -> None:
    options = RctaOptions.from_mapping({})
    assert (options.resolved_preset, options.ablation, options.candidate_cap, options.include_task) == (
        "full",
        None,
        80,
        True,
    )
    # App. H: a component condition runs at the ablation settings unless told otherwise.
    assert RctaOptions.from_mapping({"ablation": "no-a2"}).resolved_preset == "ablation"
    assert RctaOptions.from_mapping({"ablation": "no-a2", "preset": "full"}).resolved_preset == "full"
    assert not options.include_ground_truth and options.stage1_retry and options.truncation == "cap-steps"


# --- unreadable answers and A4's abstention: Attribution.error / fallback --------------------------------------

NOT_JSON = "Expecting value: line 1 column 1 (char 0)"


def _without_step(agent: str) -> dict[str, Any]:
    value = answer(agent, 5)
    del value["root_cause"]["step"]
    return value


async def test_a_valid_answer_has_no_error_and_no_fallback() -> None:
    result = await rcta().attribute(
        magentic(), llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    )
    assert result.error is None and result.fallback is None


async def test_a_model_abstention_is_neither_error_nor_fallback() -> None:
    llm = llm_with(lambda r: answer("Coder", 5, evidence=[], abstain=True), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert result.abstained and result.error is None and result.fallback is None


async def test_unparseable_attempts_are_an_error_and_no_fallback() -> None:
    result = await rcta().attribute(
        magentic(), llm_with(lambda r: "I cannot tell.", propose((5, "possible_root")))
    )
    assert result.error == f"attribution answer unreadable (2 of 2 attempts): {NOT_JSON}"
    assert result.fallback is None  # nothing of the model's was overridden
    assert (
        "abstain_missing_fields" in result.output["diagnostics"]["fallbacks"]
    )  # the output keeps its record
    no_a4 = await rcta("rcta/no-a4").attribute(magentic(), llm_with(lambda r: "I cannot tell."))
    assert no_a4.error == f"attribution answer unreadable (1 of 1 attempts): {NOT_JSON}"
    assert no_a4.fallback is None


async def test_an_unreadable_first_attempt_repaired_by_the_retry_is_fine() -> None:
    replies = iter(["I cannot tell.", answer("Coder", 5)])
    result = await rcta().attribute(
        magentic(), llm_with(lambda r: next(replies), propose((5, "possible_root")))
    )
    assert (result.pred_role, result.pred_step) == ("Coder", 5)
    assert result.error is None and result.fallback is None


async def test_a4_abstaining_on_an_invalid_role_is_a_fallback_not_an_error() -> None:
    llm = llm_with(lambda r: answer("Nobody", 5), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert result.abstained and result.pred_role is None and result.pred_step == 5
    assert result.error is None  # the role was read: it is invalid, not unreadable
    assert result.fallback == "rcta A4: agent invalid in every attempt, the output abstains (published rule)"


async def test_a_step_never_given_is_an_error_and_a4_voids_the_valid_role() -> None:
    result = await rcta().attribute(
        magentic(), llm_with(lambda r: _without_step("Coder"), propose((5, "possible_root")))
    )
    assert result.abstained and (result.pred_role, result.pred_step) == ("Coder", None)
    assert result.error is not None
    assert result.error.startswith("root_cause.step missing or mistyped in every attempt: ")
    assert result.fallback == (
        "rcta A4: step missing while the other field is valid, the output abstains (published rule)"
    )


# --- issue 16: the task in every call ---------------------------------------------------------------------------

LONG_TASK = (
    "Plan a 3-day trip from Seattle to Denver for 2 people with a total budget of $1,200; "
    "lodging must allow pets. " * 40
).strip()  # ~4,300 characters, far over any shown step cap


def longrca_like(n_steps: int = 60) -> Trajectory:
    """A LongRCA-format record: step 0 is the human task, the task is the one the loader derives from it."""
    rows = [("human", LONG_TASK)]
    rows += [
        ("manager_agent" if i % 3 == 0 else "stay_agent", f"step {i}: looked at listing {i}")
        for i in range(1, n_steps)
    ]
    steps = tuple(Step(i, agent, "assistant", content) for i, (agent, content) in enumerate(rows))
    return Trajectory(
        qid="travelplanner__001", source="travelplanner", task=LONG_TASK, steps=steps, sha256="0" * 64
    )


async def test_every_call_shows_the_task_whole_including_the_a4_retry() -> None:
    replies = iter([answer("stay_agent", 999), answer("stay_agent", 5)])
    llm = RoutedLLM(
        {
            "summary": summary_for(propose((5, "possible_root"))),
            "outline": outline_route,
            "attribution": lambda r: next(replies),
        }
    )
    result = await rcta().attribute(longrca_like(), llm)
    m = len(result.output["segments"])
    assert m == 15  # 60 steps, 4 per segment: only segment 0 holds step 0
    assert llm.stages() == ["summary"] * m + ["outline", "attribution", "attribution"]
    for request in llm.requests:
        assert f"Task:\n{LONG_TASK}\n" in request.user, request.stage
        assert "(not recorded)" not in request.user
    assert result.pred_step == 5


async def test_without_the_task_every_call_says_it_is_not_recorded() -> None:
    llm = llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    await rcta(include_task=False).attribute(magentic(), llm)
    assert all("Task:\n(not recorded)\n" in r.user for r in llm.requests)
    unrecorded = Trajectory("hand/2", "hand_crafted", None, magentic().steps, "0" * 64)
    llm = llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    await rcta().attribute(unrecorded, llm)
    assert all("Task:\n(not recorded)\n" in r.user for r in llm.requests)


async def test_a_task_over_the_shared_cap_is_cut_in_the_middle_in_every_call() -> None:
    huge = "A" * 7_000 + "MIDDLE" + "Z" * 7_000
    trajectory = Trajectory("hand/3", "hand_crafted", huge, magentic().steps, "0" * 64)
    llm = llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    await rcta().attribute(trajectory, llm)
    for request in llm.requests:
        shown = request.user.split("Task:\n", 1)[1]
        assert shown.startswith("A" * 1_000) and "MIDDLE" not in shown and "Z" * 1_000 in shown


# --- issue 16: candidates from the summaries and the outline ---------------------------------------------------


async def test_outline_phase_steps_join_the_candidates_with_their_source() -> None:
    routes: dict[str, Route] = {
        "summary": summary_for(propose((5, "possible_root"), (11, "possible_manifestation"))),
        "outline": outline_with(signals=[8, 5], supporting=[9, 10, 2, 3]),
        "attribution": lambda r: answer("Coder", 5),
    }
    llm = RoutedLLM(routes)
    result = await rcta().attribute(magentic(), llm)
    out = result.output
    # summaries: 5, 11; outline: signals 8, 5 and the first three supporting ids 9, 10, 2 (never 3)
    assert out["candidates"]["base_ids"] == [2, 5, 8, 9, 10, 11]
    assert out["candidates"]["proposals"] == 2 and out["candidates"]["outline_hints"] == 5
    pooled = {c["step"]: c for c in out["candidates"]["pooled"]}
    assert {step: c["source"] for step, c in pooled.items()} == {
        2: "outline",
        5: "both",
        8: "outline",
        9: "outline",
        10: "outline",
        11: "summary",
    }
    assert pooled[5]["tags"] == ["possible_root"] and pooled[8]["tags"] == [] and pooled[8]["priority"] == 3
    # retrieval order: manifestation 11, root 5, then the untagged outline ids by ascending id
    assert [c["step"] for c in out["candidates"]["pooled"]] == [11, 5, 2, 8, 9, 10]
    diagnostics = out["diagnostics"]
    assert diagnostics["summary_candidate_ids"] == [5, 11]
    assert diagnostics["outline_candidate_ids"] == [2, 5, 8, 9, 10]
    assert diagnostics["base_candidate_ids"] == [2, 5, 8, 9, 10, 11]
    prompt = attribution_user(llm)
    assert {2, 5, 8, 9, 10, 11} <= set(excerpt_ids_in(prompt))
    assert "candidate: tags possible_root; proposed by local:1, outline:1; notes: note 5; " in prompt
    assert "candidate: tags -; proposed by outline:1; notes: outline phase 1 failure signal (high)" in prompt


async def test_the_outline_fallback_leaves_the_summaries_as_the_only_source() -> None:
    routes: dict[str, Route] = {
        "summary": summary_for(propose((5, "possible_root"))),
        "outline": lambda r: "not json",
        "attribution": lambda r: answer("Coder", 5),
    }
    result = await rcta().attribute(magentic(), RoutedLLM(routes))
    diagnostics = result.output["diagnostics"]
    assert diagnostics["outline_fallback"] is True and diagnostics["outline_candidate_ids"] == []
    assert diagnostics["summary_candidate_ids"] == diagnostics["base_candidate_ids"] == [5]


async def test_no_a1_draws_as_many_uniform_steps_as_both_sources_pooled_and_credits_no_source() -> None:
    routes: dict[str, Route] = {
        "summary": summary_for(propose((5, "possible_root"))),
        "outline": outline_with(signals=[8], supporting=[9]),
        "attribution": lambda r: answer("Coder", 5),
    }
    llm = RoutedLLM(routes)
    result = await rcta("rcta/no-a1").attribute(magentic(), llm)
    out = result.output
    assert out["candidates"]["pooled_ids"] == [5, 8, 9]
    assert out["candidates"]["base_ids"] == list(uniform_ids(12, 3))
    assert out["diagnostics"]["summary_candidate_ids"] == out["diagnostics"]["outline_candidate_ids"] == []
    assert "outline:1" not in attribution_user(llm)


# --- issue 16: validity and coverage as the paper defines them ----------------------------------------------------


async def test_role_and_step_are_independent_no_retry_and_covered() -> None:
    # A planner role with an executor's step and an execution category: the release's consistency rules would
    # retry it; the paper has no such rule.
    llm = llm_with(lambda r: answer("Orchestrator", 5, category="D1"), propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages().count("attribution") == 1
    assert (result.pred_role, result.pred_step, result.role_valid, result.step_valid) == (
        "Orchestrator",
        5,
        True,
        True,
    )
    out = result.output
    assert out["covered"] is True and not out["needs_review"]
    assert out["coverage_checks"] == {
        "recorded_role": True,
        "root_step": True,
        "chain_structure": True,
        "handoff_evidence": True,
    }


async def test_release_consistency_rules_are_an_option_that_retries_but_never_decides_coverage() -> None:
    llm = llm_with(lambda r: answer("Orchestrator", 5, category="D1"), propose((5, "possible_root")))
    result = await rcta(release_consistency_rules=True).attribute(magentic(), llm)
    assert llm.stages().count("attribution") == 2
    assert "consistency: the planner-class agent 'Orchestrator' must point at a planner-class step" in (
        attribution_user(llm, 1)
    )
    out = result.output
    assert (result.pred_role, result.pred_step) == ("Orchestrator", 5)
    assert out["covered"] is True and out["needs_review"] is True
    assert any(e.startswith("consistency: ") for e in out["final_errors"])


async def test_covered_follows_the_four_checks_after_the_merge() -> None:
    broken = answer("Coder", 5)
    broken["analysis"]["failure_chain"] = broken["analysis"]["failure_chain"][:1]  # no terminal node
    llm = llm_with(lambda r: broken, propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    out = result.output
    assert llm.stages().count("attribution") == 2
    assert out["covered"] is False and not result.abstained
    assert out["coverage_checks"]["chain_structure"] is False
    assert [name for name, ok in out["coverage_checks"].items() if not ok] == ["chain_structure"]
    # the A4 control measures the same four checks on its first answer
    no_a4 = await rcta("rcta/no-a4").attribute(
        magentic(), llm_with(lambda r: broken, propose((5, "possible_root")))
    )
    assert no_a4.output["covered"] is False and no_a4.output["coverage_checks"]["chain_structure"] is False


def test_release_consistency_rules_option_defaults_off_and_must_be_a_bool() -> None:
    assert RctaOptions.from_mapping({}).release_consistency_rules is False
    with pytest.raises(ConfigError):
        create_method("rcta", options={"release_consistency_rules": "yes"})


# --- issue 16: abstentions keep their role and step ------------------------------------------------------------


@pytest.mark.parametrize("name", ["rcta", "rcta/no-a4"])
async def test_an_abstaining_answer_keeps_the_role_and_step_it_gives(name: str) -> None:
    llm = llm_with(lambda r: answer("Coder", 5, evidence=[], abstain=True), propose((5, "possible_root")))
    result = await rcta(name).attribute(magentic(), llm)
    assert result.abstained is True
    assert (result.pred_role, result.pred_step, result.role_valid, result.step_valid) == (
        "Coder",
        5,
        True,
        True,
    )
    assert result.output["model_abstained"] is True and result.output["covered"] is False
    assert result.error is None and result.fallback is None


# --- issue 16: smaller items ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("phases", "in_range"), [(2, False), (3, True), (9, False)])
async def test_an_outline_outside_three_to_eight_phases_is_used_and_recorded(
    phases: int, in_range: bool
) -> None:
    routes: dict[str, Route] = {
        "summary": summary_for(propose((5, "possible_root"))),
        "outline": outline_with(phases=phases),
        "attribution": lambda r: answer("Coder", 5),
    }
    llm = RoutedLLM(routes)
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages().count("outline") == 1  # no retry for the phase count
    outline_request = next(r for r in llm.requests if r.stage == "outline")
    assert outline_request.schema is not None
    assert "maxItems" not in outline_request.schema["properties"]["phases"]
    assert "3 to 8 phases" in outline_request.user  # still asked for
    out = result.output
    assert (
        out["stages"]["outline"]["phases"] == phases
        and out["stages"]["outline"]["phases_in_range"] is in_range
    )
    assert out["diagnostics"]["outline_phases"] == phases
    assert out["diagnostics"]["outline_phases_in_range"] is in_range
    assert out["diagnostics"]["outline_fallback"] is False
    assert "outline" not in out["diagnostics"]["fallbacks"]
    assert attribution_user(llm).count('"phase_id"') == phases


async def test_a_summary_may_propose_more_than_twelve_steps() -> None:
    trajectory = longrca_like(40)
    every = propose(*[(i, "other") for i in range(40)])
    llm = RoutedLLM(
        {
            "summary": summary_for(every),
            "outline": outline_route,
            "attribution": lambda r: answer("stay_agent", 5),
        }
    )
    result = await rcta(segmentation={"max_steps": 20}).attribute(trajectory, llm)
    first = llm.requests[0]
    assert first.schema is not None and "maxItems" not in first.schema["properties"]["proposed_steps"]
    assert "at most 12" not in first.user
    assert result.output["stages"]["summary"][0]["errors"] == 0
    assert result.output["candidates"]["base_ids"] == list(range(40))


async def test_a_digit_string_step_is_read_as_an_integer() -> None:
    def stringly(request: Request) -> dict[str, Any]:
        value = answer("Coder", 5)
        value["root_cause"]["step"] = "5"
        return value

    llm = llm_with(stringly, propose((5, "possible_root")))
    result = await rcta().attribute(magentic(), llm)
    assert llm.stages().count("attribution") == 1
    assert result.pred_step == 5 and isinstance(result.pred_step, int) and result.step_valid
    assert result.output["covered"] is True


def test_presets_state_full_and_ablation_reasoning_separately() -> None:
    assert set(PRESET_REASONING) == set(PRESETS) == {"full", "ablation"}
    ablation = PRESET_REASONING["ablation"]
    assert (ablation.summary, ablation.outline, ablation.attribution) == ("off", "high", "high")  # App. H
    assert RctaOptions.from_mapping({"preset": "full"}).reasoning is PRESET_REASONING["full"]
    assert RctaOptions.from_mapping({"preset": "ablation"}).reasoning is PRESET_REASONING["ablation"]


@pytest.mark.parametrize("preset", ["full", "ablation"])
async def test_each_stage_sends_its_presets_reasoning_and_budget(preset: str) -> None:
    llm = llm_with(lambda r: answer("Coder", 5), propose((5, "possible_root")))
    made = rcta(preset=preset)
    await made.attribute(magentic(), llm)
    reasoning, budgets = PRESET_REASONING[preset], PRESETS[preset]
    expected = {
        "summary": (reasoning.summary, budgets.summary),
        "outline": (reasoning.outline, budgets.outline),
        "attribution": (reasoning.attribution, budgets.attribution),
    }
    assert {r.stage: (r.reasoning, r.max_tokens) for r in llm.requests} == expected
    assert made.stage_budgets == {stage: budget for stage, (_, budget) in expected.items()}
