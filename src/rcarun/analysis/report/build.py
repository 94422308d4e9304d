"""`build_report`: one run's `Report` (its JSON schema and rules: docs/analysis.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from rcarun.errors import ConfigError, StoreError
from rcarun.store import RunRow, Store

from ..cost import cost_rows, served_by
from ..protocol import MethodKind, Protocol, app_b_backbones, method_kinds, resolve_protocol, uses_manifest
from ..results import RunScores, load_run_scores
from ..timing import call_timing
from .cells import _excluded, _metrics, _outcome_json
from .model import MethodInfo, NotCompared, ProtocolInfo, Report, RunInfo
from .options import MIN_READABLE_SHARE, ReportOptions, _Study, _study
from .paired import (
    Paired,
    _adjust,
    _complementarity,
    _families,
    _leave_one_source_out,
    _paired_across,
    _paired_backbones,
    _paired_methods,
    _task_clusters,
)
from .studies import (
    _calibration,
    _components,
    _fidelity,
    _label_sensitivity,
    _length_contrasts,
    _length_groups,
    _recall,
    _repeatability,
    _turns,
)


def _protocol(store: Store, run: RunRow, kinds: Mapping[str, MethodKind], options: ReportOptions) -> Protocol:
    sizes = Counter(
        row.source
        for row in store.trajectories(run.run_id)
        if row.ref_role is not None and row.ref_step is not None
    )
    return resolve_protocol(
        kinds,
        sizes,
        manifest=uses_manifest(run.config_json),
        protocol=options.protocol,
        aggregate=None if options.aggregate in (None, "auto") else options.aggregate,
        resamples=options.resamples,
        seed=options.seed,
        keep_handoff=options.keep_handoff,
        abstentions=options.abstentions,
        holm_family=options.holm_family,
        paired_metrics=options.paired_metrics,
    )


def build_report(
    store: Store, run_id: int, options: ReportOptions | None = None, *, full_store: Store | None = None
) -> Report:
    """The report of one run (its JSON schema: docs/analysis.md).

    Args:
        store: the results database holding the run.
        run_id: the run.
        options: how to compute it (defaults: the protocol's, `ReportOptions`).
        full_store: where ``options.calibrate_against`` lives, when not in ``store``.

    Raises:
        StoreError: no such run (or no such Full run to calibrate against).
        ConfigError: a choice the run cannot honour (an unknown reference method, ``ablation`` without full
            RCTA and a component condition, a Full run whose sources differ, annotations out of range).
    """
    options = options or ReportOptions()
    run = next((r for r in store.runs() if r.run_id == run_id), None)
    if run is None:
        raise StoreError(f"{store.path}: no run with id {run_id}")
    kinds = method_kinds(run.config_json, store.work_names(run_id).methods)
    protocol = _protocol(store, run, kinds, options)
    scores = load_run_scores(store, run, keep_handoff=protocol.keep_handoff, abstentions=protocol.abstentions)
    kinds = {**kinds, **method_kinds(run.config_json, [m for m in scores.methods if m not in kinds])}
    reference = _reference_method(scores, kinds, options.reference_method, protocol)
    study = _study(kinds, reference)
    compared = _compared(scores, kinds, reference, protocol, study)
    if options.holm_backbones:
        holm_why = "--holm-backbones"
    else:
        family, holm_why = app_b_backbones(run.config_json, scores.backbones)
        options = replace(options, holm_backbones=family)
    paired = _paired_methods(scores, reference, compared, kinds, protocol, options)
    if not options.compare_backbones and len(scores.methods) == 1 and len(scores.backbones) > 1:
        options = replace(options, compare_backbones=tuple(scores.backbones))
    paired_backbones = _paired_backbones(scores, protocol, options)
    paired_across = _paired_across(scores, reference, compared, protocol, options)
    paired, paired_backbones, paired_across = _adjust(paired, paired_backbones, paired_across)
    components = _components(store, run, scores, kinds, protocol, options, study)
    left_out = sorted(m for m in scores.methods if m != reference and m not in compared)
    # The methods of the protocol's comparison: App. A and K.1 set these side by side, as the paper its six.
    members = [m for m in scores.methods if m == reference or m in compared]
    return Report(
        run=RunInfo(run.name, run.run_id, run.status, run.created_at),
        db=str(store.path),
        simulated=scores.simulated,
        aggregate=protocol.aggregate,
        reference_method=reference,
        expected=len(scores.expected),
        unlabelled=scores.unlabelled,
        protocol=_protocol_json(
            protocol, options, holm_why, kinds, study, left_out, paired + paired_backbones + paired_across
        ),
        outcomes=[_outcome_json(cell, outcome) for cell, outcome in sorted(scores.outcomes.items())],
        excluded=_excluded(scores),
        metrics=_metrics(scores, protocol, options),
        paired=[entry for entry, _ in paired],
        paired_backbones=[entry for entry, _ in paired_backbones],
        paired_across=[entry for entry, _ in paired_across],
        complementarity=_complementarity(scores, reference, compared),
        components=components,
        repeatability=_repeatability(scores, protocol),
        recall=_recall(scores),
        turns=_turns(scores, protocol, options),
        task_clusters=_task_clusters(store, run, scores, reference, compared, protocol, options),
        leave_one_source_out=_leave_one_source_out(scores, reference, compared, protocol, options),
        length_groups=_length_groups(scores, options),
        length_contrasts=_length_contrasts(scores, options),
        fidelity=_fidelity(store, run, scores, members, protocol, options, full_store),
        calibration=_calibration(scores, members, options),
        label_sensitivity=_label_sensitivity(scores, reference, members, options),
        cost=tuple(cost_rows(store, run_id)),
        served_by=tuple(served_by(store, run_id)),
        call_timing=tuple(call_timing(store, run_id)),
    )


_PROTOCOL_AS_IS = (
    *("name", "reason", "abstentions", "keep_handoff", "aggregate_reason"),
    *("resamples", "resamples_reason", "seed", "holm_family"),
)
"""The `Protocol` attributes the report's protocol keeps under the same name."""


def _protocol_json(
    protocol: Protocol,
    options: ReportOptions,
    holm_why: str,
    kinds: Mapping[str, MethodKind],
    study: _Study | None,
    left_out: Sequence[str],
    compared: Paired,
) -> ProtocolInfo:
    """The report's ``protocol``: the rules in force, why, and which methods were left out of the comparison."""
    kept = {name: getattr(protocol, name) for name in _PROTOCOL_AS_IS}
    return ProtocolInfo(
        **kept,
        requested=options.protocol,
        scoring_rule=protocol.rule,
        confidence=options.confidence,
        holm_backbones=tuple(options.holm_backbones),
        holm_backbones_reason=holm_why,
        families=_families(compared, options, holm_why),
        paired_metrics=tuple(protocol.paired_metrics),
        not_compared=tuple(NotCompared(m, _why_not_compared(kinds[m], protocol, study)) for m in left_out),
        compare_backbones=tuple(options.compare_backbones),
        populations=dict(options.populations) if options.populations else None,
        min_readable_share=MIN_READABLE_SHARE,
        methods={label: MethodInfo(kind.name, kind.ablation) for label, kind in sorted(kinds.items())},
    )


def _reference_method(
    scores: RunScores, kinds: Mapping[str, MethodKind], wanted: str | None, protocol: Protocol
) -> str | None:
    methods = scores.methods
    if wanted is not None:
        if wanted not in methods:
            raise ConfigError(
                f"reference method {wanted!r} is not in run {scores.run.name!r} (methods: {methods})"
            )
        if protocol.name == "ablation" and not kinds[wanted].full_rcta:
            raise ConfigError(
                f"--reference: the ablation protocol compares the component conditions with full RCTA, and "
                f"{wanted!r} is {kinds[wanted].name!r}"
            )
        return wanted
    full = [m for m in methods if kinds[m].full_rcta]
    if "rcta" in full:
        return "rcta"
    if full:
        return full[0]
    return methods[0] if methods else None


def _compared(
    scores: RunScores,
    kinds: Mapping[str, MethodKind],
    reference: str | None,
    protocol: Protocol,
    study: _Study | None,
) -> tuple[str, ...]:
    """The methods compared with the reference: every other one (main; the component conditions go to the
    component table when the run holds the study), or the component conditions (ablation)."""
    if reference is None:
        return ()
    if protocol.name == "ablation":
        return study.conditions if study is not None else ()
    held_back = set(study.conditions) if study is not None else set()
    return tuple(m for m in scores.methods if m != reference and m not in held_back)


def _why_not_compared(kind: MethodKind, protocol: Protocol, study: _Study | None) -> str:
    if protocol.name == "ablation":
        return "not part of the component study (the ablation protocol compares conditions with full RCTA)"
    if study is not None and kind.component_condition:
        return "a component condition: compared with full RCTA in the component study, under its rules"
    return "not compared"
