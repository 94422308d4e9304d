"""FALAT (Rafi et al., 2026): dependency-guided search for the step that introduced a failure — RECONSTRUCTED.

No public code of FALAT exists. The LongRCA paper describes it in one sentence: it traces "typed dependencies
among decisions, tool outputs, and messages to separate error sources from downstream carriers and guide
candidate pruning and verification". This package rebuilds that idea as six stages, each a plain function over
frozen dataclasses so that each can be tested on its own. Where a stage is deterministic, its rules are
written here.

Where each part lives (each module's docstring points back to the stage it implements):

- `step_types`: stage 1, typing (`type_step`, `type_steps`).
- `graph`: stage 2, linking (`salient_tokens`, `link_steps`, `DependencyGraph`, `ancestors`).
- `schemas`: the answers of the two LLM stages, 3 (locate) and 6 (verify): their schemas and strict readers.
- `prompts`: the locate and verify prompts of stages 3 and 6, fitted to the context window.
- `search`: stages 4 to 6 without the model (`walk_back`, `prune_carriers`, `search_sources`, `decide`).
- `method`: `FalatOptions`, the `Falat` method that runs the stages in order, its output record, and the
  ``"falat"`` registration.

Stages (LLM = one model call; everything else is deterministic):

1. Typing (`type_steps`). Each step gets one type, by the first rule that matches:

   - ``tool_output``: the speaker is a terminal/tool agent (``Computer_terminal``, ``ComputerTerminal``,
     ``terminal``, ``tool``, ``environment``, ``observation``, compared casefolded without ``_ -`` and
     spaces), or the raw chat role is ``tool``/``function``/``ipython``/``observation``, or the content opens
     with an exit-code line (``exitcode: 1 (execution failed)``, ``Exit code = 0``). Only the start counts, so
     an agent quoting an exit code is not a tool.
   - ``tool_call``: a fenced code block tagged with a programming or shell language (python, bash, sh, sql,
     ...); a function-call marker (a ``finish(`` action, an ``Action:``/``Tool call:`` line, ``<function=``,
     ``<tool_call>``, a ``"tool_calls"``/``"function_call"`` key); or an agent's report of an action it took
     with a tool, opening with "I clicked/typed/scrolled/input/..." (Magentic-One's WebSurfer: the agent chose
     the action, the page it then saw is part of the same step).
   - ``decision``: a step that announces an explicit handoff (``Step.handoff``: an instruction to another
     agent); a planner by name (the agent's name contains orchestrat / planner / manager / diagnost, e.g.
     Magentic-One's Orchestrator thoughts and ledgers, LongRCA's DiagnostAgent, Task_Planner, manager_agent);
     or an intent marker in the first 400 characters ("plan", "I will", "we'll", "let's", "next step", "next
     speaker", "we should", "we need to", "I suggest", ...).
   - ``message``: everything else (the task statement, reports, verifications, "TERMINATE").

2. Linking (`link_steps` → `DependencyGraph`). Edges only point backward (``depends_on < step``); a pair of
   steps has one edge listing every kind that links it:

   - ``tool_result``: a tool output depends on the call it answers — the latest earlier step that is not
     itself a tool output (consecutive outputs answer the same call) — when that step is a tool call. When it
     is not (an AG2 terminal saying "there is no code to execute"), the edge is a ``reply`` to it instead.
   - ``instruction``: any other step depends on the latest step at most ``link_window`` steps back that handed
     off to its speaker (recipient and speaker compared as the scorer compares roles).
   - ``reply``: a step with neither of the above depends on the step just before it (the message it answers).
   - ``reference``: a step depends on an earlier step at most ``link_window`` steps back whose outputs it
     reuses: for every salient token of the step, the latest earlier step in the window holding the same token
     is credited; a step credited with at least ``min_shared_tokens`` tokens is linked. Salient tokens are
     URLs, file names and domains (``name.ext``), numbers with at least three digits not counting leading
     zeros (thousands separators dropped, so ``737,015`` = ``737015``; ``1.46`` counts, ``1.0`` and ``0.01``
     do not), quoted strings of 3–80 characters, and code identifiers (snake_case or camelCase), all
     casefolded. JSON object keys are removed first (they are structure, not data), and a token does not count
     when it occurs in the task statement (it was given, not produced), is a recorded agent's name, or is
     boilerplate: present in at least 3 steps and in more than ``boilerplate_share`` of all steps.

3. Failure point (LLM, stage ``"locate"``): one call over the typed log (fitted to the context window by the
   shared cap-steps policy of `rcarun.methods.context`) asks for the earliest step where the failure is
   VISIBLE, as ``{reason, failure_step}`` with the step's bounds in the schema (a digit string such as ``"12"``
   is read as that integer, by the scorer's rule, `rcarun.data.parse_step`). A malformed, non-integer or
   out-of-range answer falls back to the last step (the end of a failed run is where its failure is certainly
   visible); the fallback and its cause are recorded.

4. Backward walk (`walk_back`): the failure step itself (it may be where the error is made, e.g. a wrong final
   answer) and its ancestors in breadth-first order of hops, ties broken by the later step (closer to the
   failure), up to ``max_candidates`` steps in all.

5. Pruning (`prune_carriers`): a candidate is a downstream carrier when one of its own ancestors in the graph
   is also a candidate AND it reuses that ancestor's content: it shares at least ``min_shared_tokens`` salient
   tokens with it, or it is a tool output whose ``tool_result`` edge points at it (an output carries whatever
   its call got wrong). Carriers are set aside with the candidates they carry from; the rest are the
   source-most candidates. An instruction or reply edge alone is not reuse: an agent that follows an
   instruction may still make its own mistake.

6. Verification and decision (LLM, stage ``"verify"``, then `decide`). The source-most candidates are verified
   one call each, earliest step first (`search_sources`). Each prompt shows the task, the candidate with its
   direct dependencies (up to ``max_context_parents`` nearest parents, with the kinds and shared tokens of
   each link), the dependency path to the failure and the failure step, within ``verify_context_chars``
   characters of step text (the candidate may take twice the share of each other step); the answer is
   ``{reason, is_source, confidence}``. A step is verified when ``is_source`` is true and ``confidence >=
   min_confidence``. An answer that is not a JSON object, or whose ``is_source`` is not a boolean or whose
   ``confidence`` is not a number in [0, 1], is recorded as malformed and counts as not verified.

   The queue is ordered by step and the search stops at the first verified step: that IS the earliest verified
   source, with fewer calls than verifying every candidate. At most ``max_verify_calls`` calls are made;
   candidates left in the queue when the budget runs out are recorded as unverified. Pruned carriers are never
   verified: that is the description's "prune candidates that only carry an earlier error".

   Option ``reinstate_carriers`` (default ``False``; NOT part of FALAT as described, and tuned on gold labels,
   so it is off in every reproduction run): when verification clears every candidate a carrier carries from,
   the carrier is put back into the queue (a carrier always comes after what it carries from, so the queue
   stays in step order). It was motivated by a run against Who&When's attribution labels — walking back from
   the last step with a verifier that only confirms the labelled step, the search reaches the label in 117 of
   146 trajectories with reinstatement and in 65 without — which makes it a choice fitted to the labels the
   method is scored on (fidelity audit 2026-12, §1.6); it stays available for ablations that say so.

   Decision (`decide`): the earliest verified source (rule ``"earliest-verified"``). Fallbacks, recorded: with
   no verified step, the candidate with the highest confidence among well-formed verdicts (ties: the earlier
   step; rule ``"highest-confidence"``); with no well-formed verdict at all, the failure step (rule
   ``"failure-step"``).

Protocol (LongRCA Sec. 5.1): the prediction has an explicit role and a 0-based step. FALAT localises a step
and does not ask the model for a role, so the role is the recorded speaker (``Step.agent``) of the chosen
step, set as an explicit field; it is therefore always one of the recorded agents. Step answers carry their
bounds in the schema; invalid fields are recorded, never repaired (a fallback is a documented rule of the
method, and is recorded as such). The task's ground-truth final answer is not shown unless
``include_ground_truth=True``.

Unreadable answers and fallbacks (``Attribution.error`` / ``fallback``; the output's ``failure.fallback`` and
``decision.fallback`` records stay as they are):

- ``fallback`` is set when a recorded fallback shaped the prediction: the locate fallback (the walk started
  from the last step because the locate answer was unusable: the candidates, and so the prediction, follow
  from the rule) and the decision fallbacks ``"highest-confidence"`` and ``"failure-step"`` (no verified
  source). The text names each rule that fired and, for the decision, how many verdicts were malformed.
- ``error`` is set when the prediction rests on no answer of the model: the locate answer could not be read
  (not a JSON object, ``failure_step`` missing or not an integer) and no verification was readable, so the
  predicted step is the last step by rule. A locate answer that was read but lies outside the log is validity,
  not an error; one readable verdict is enough for the prediction to rest on the model.

A trajectory without steps is an abstention with no call. Calls per trajectory: 1 (locate) + at most
``min(max_verify_calls, max_candidates)`` (verify); 1 + 8 with the defaults.

The task: the locate prompt and every verify prompt state the task instruction whole (up to
`rcarun.methods.context.TASK_CHAR_CAP`, `task_text`): the record's ``question``, or on LongRCA records, which have
none, the instruction the loader derived from the opening step(s) of the history (`rcarun.data.derive_task`).
A verify prompt shows only the candidate, its nearest dependencies and the failure step, so without that line a
verifier would judge a step against a task it never saw.
"""

from rcarun.methods.falat.graph import (
    EDGE_KINDS,
    DependencyGraph,
    Edge,
    EdgeKind,
    ancestors,
    link_steps,
    salient_tokens,
)
from rcarun.methods.falat.method import Falat, FalatOptions
from rcarun.methods.falat.prompts import Templates, locate_messages, verify_messages, weighted_caps
from rcarun.methods.falat.schemas import (
    FailurePoint,
    Verdict,
    locate_schema,
    parse_failure_point,
    parse_verdict,
    verify_schema,
)
from rcarun.methods.falat.search import (
    Candidate,
    Decision,
    DecisionRule,
    PrunedCandidate,
    Pruning,
    SearchResult,
    decide,
    is_verified,
    path_to_failure,
    prune_carriers,
    search_sources,
    walk_back,
)
from rcarun.methods.falat.step_types import STEP_TYPES, StepType, TypedStep, type_step, type_steps

__all__ = [
    "EDGE_KINDS",
    "STEP_TYPES",
    "Candidate",
    "Decision",
    "DecisionRule",
    "DependencyGraph",
    "Edge",
    "EdgeKind",
    "FailurePoint",
    "Falat",
    "FalatOptions",
    "PrunedCandidate",
    "Pruning",
    "SearchResult",
    "StepType",
    "Templates",
    "TypedStep",
    "Verdict",
    "ancestors",
    "decide",
    "is_verified",
    "link_steps",
    "locate_messages",
    "locate_schema",
    "parse_failure_point",
    "parse_verdict",
    "path_to_failure",
    "prune_carriers",
    "salient_tokens",
    "search_sources",
    "type_step",
    "type_steps",
    "verify_messages",
    "verify_schema",
    "walk_back",
    "weighted_caps",
]
