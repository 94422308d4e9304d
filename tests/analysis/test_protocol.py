"""The paper's two protocols: which one a report follows, and what each changes (LongRCA Sec. 5.1, App. B, H, L.1).

Two runs are written row by row (every number below is worked out by hand):

``study``: RCTA's component study on backbone ``bb``, 8 trajectories (s1: q0–q3, s2: q4–q7), every reference
``DiagnostAgent (-> ActionAgent)`` at step 10.

- ``rcta``: q0 the handoff form at 10 (right under both rules); q1 ``DiagnostAgent`` at 10 (role right only
  when suffixes are dropped); q2 abstains with the handoff form at 10 (right only when abstentions keep their
  fields); q3 ``ActionAgent`` at 12 (±5 only); q4–q7 ``Planner`` at 30. Main rule: Agent 3/8, Step 3/8;
  ablation rule: Agent 1/8, Step 2/8. Coverage: stored ``covered`` True on q0–q2 (q2 abstains: not covered),
  False on q3, none on q4–q7 (valid role and step: covered): 6/8 under both.
- ``rcta/no-a1``: ``Planner`` at 30 everywhere: nothing right.
- ``rcta/no-a4`` (``rcta`` with ``ablation = "no-a4"`` in the config): q0 and q4 the handoff form at 10, the
  rest ``Planner`` at 30: Step 2/8 under both rules.

``main``: two backbones × full RCTA, two of the paper's baselines (``aao`` = all-at-once, ``echo``) and
self-consistency (``sc``), with deterministic pseudo-random answers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from analysis.builders import Pred, Traj, build_run
from rcarun.analysis import (
    MethodKind,
    Report,
    ReportOptions,
    build_report,
    holm,
    mcnemar_exact,
    method_kinds,
    render_html,
    render_text,
    resolve_protocol,
)
from rcarun.cli import main
from rcarun.errors import ConfigError
from rcarun.store import open_store

HANDOFF = "DiagnostAgent (-> ActionAgent)"
ROLES = (HANDOFF, "ActionAgent", "Planner")
STUDY = [Traj(f"q{i}", "s1" if i < 4 else "s2", ref_role=HANDOFF, ref_step=10, roles=ROLES) for i in range(8)]
STUDY_METHODS = [
    {"name": "rcta"},
    {"name": "rcta/no-a1"},
    {"name": "rcta", "label": "rcta/no-a4", "options": {"ablation": "no-a4"}},
]


def _study_predictions() -> list[Pred]:
    rcta = [
        Pred("bb", "rcta", "q0", HANDOFF, 10, output={"covered": True}),
        Pred("bb", "rcta", "q1", "DiagnostAgent", 10, output={"covered": True}),
        Pred("bb", "rcta", "q2", HANDOFF, 10, abstained=True, output={"covered": True}),
        Pred("bb", "rcta", "q3", "ActionAgent", 12, output={"covered": False}),
        *(Pred("bb", "rcta", f"q{i}", "Planner", 30) for i in range(4, 8)),
    ]
    no_a1 = [Pred("bb", "rcta/no-a1", t.qid, "Planner", 30) for t in STUDY]
    no_a4 = [
        Pred("bb", "rcta/no-a4", t.qid, *((HANDOFF, 10) if t.qid in ("q0", "q4") else ("Planner", 30)))
        for t in STUDY
    ]
    return [*rcta, *no_a1, *no_a4]


MAIN = [Traj(f"m{i}", "s1" if i < 12 else "s2", ref_step=5) for i in range(20)]  # 12/8: Full-like
MAIN_METHODS = [
    {"name": "rcta"},
    {"name": "all-at-once", "label": "aao"},
    {"name": "echo"},
    {"name": "self-consistency", "label": "sc"},
]


def _main_predictions() -> list[Pred]:
    rng = random.Random(7)
    chance = {"rcta": 0.7, "aao": 0.3, "echo": 0.4, "sc": 0.35}
    preds = []
    for backbone in ("b1", "b2"):
        for method, p in chance.items():
            for traj in MAIN:
                right = rng.random() < p
                preds.append(
                    Pred(backbone, method, traj.qid, "Planner" if right else "Coder", 5 if right else 25)
                )
    return preds


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("protocol") / "results.db"
    build_run(path, "study", STUDY, _study_predictions(), methods=STUDY_METHODS)
    build_run(path, "main", MAIN, _main_predictions(), methods=MAIN_METHODS)
    mixed = [*_study_predictions(), *(Pred("bb", "aao", t.qid, "Planner", 30) for t in STUDY)]
    build_run(path, "mixed", STUDY, mixed, methods=[*STUDY_METHODS, {"name": "all-at-once", "label": "aao"}])
    return path


def _report(db: Path, run: str, **options: Any) -> Report:
    with open_store(db, read_only=True) as store:
        found = store.run_by_name(run)
        assert found is not None
        return build_report(store, found.run_id, ReportOptions(**options))


def _metrics(report: Report, method: str, backbone: str = "bb") -> dict[str, Any]:
    [row] = [r for r in report.metrics if (r.backbone, r.method, r.realization) == (backbone, method, 0)]
    return row.to_json()


# --- protocol resolution ----------------------------------------------------------------------------------------


def test_method_kinds_come_from_the_stored_config() -> None:
    config = json.dumps({"methods": [*STUDY_METHODS, {"name": "all-at-once", "label": "aao"}, {"bad": 1}]})
    kinds = method_kinds(config, ["rcta", "rcta/no-a1", "rcta/no-a4", "aao", "rcta/no-a2", "echo"])
    assert kinds["rcta"].full_rcta and not kinds["rcta"].paper_baseline
    assert (kinds["rcta/no-a1"].name, kinds["rcta/no-a1"].ablation) == ("rcta/no-a1", "no-a1")
    assert (kinds["rcta/no-a4"].name, kinds["rcta/no-a4"].ablation) == ("rcta", "no-a4")
    assert kinds["aao"].name == "all-at-once" and kinds["aao"].paper_baseline
    # labels the config does not know are their own names
    assert kinds["rcta/no-a2"].component_condition and kinds["echo"].paper_baseline
    assert method_kinds("not json", ["x"]) == {"x": MethodKind("x", "x")}


def _kinds(*labels: str) -> dict[str, MethodKind]:
    return method_kinds("{}", labels)


@pytest.mark.parametrize(
    ("labels", "name"),
    [
        (("rcta", "rcta/no-a1", "rcta/no-a2"), "ablation"),  # only the study: App. H's protocol
        (("rcta", "rcta/no-a1", "echo"), "main"),  # the study among others: main, plus a component table
        (("rcta", "echo"), "main"),
        (("rcta/no-a1", "rcta/no-a2"), "main"),  # no full RCTA to compare with
    ],
)
def test_auto_picks_the_ablation_protocol_only_for_a_pure_component_study(
    labels: tuple[str, ...], name: str
) -> None:
    protocol = resolve_protocol(_kinds(*labels), {"s1": 40, "s2": 40}, manifest=False, seed=1)
    assert protocol.name == name and protocol.reason.startswith("auto:")


def test_each_protocol_fixes_its_paper_defaults() -> None:
    main_rules = resolve_protocol(_kinds("rcta", "echo"), {"s1": 40, "s2": 40}, manifest=False, seed=1)
    assert (main_rules.abstentions, main_rules.keep_handoff, main_rules.resamples) == (
        "fields",
        False,
        20_000,
    )
    assert main_rules.paired_metrics == ("agent_acc", "step_acc") and main_rules.holm_family == "paper"
    assert "Sec. 5.1" in main_rules.rule and "App. B" in main_rules.resamples_reason
    ablation = resolve_protocol(_kinds("rcta", "rcta/no-a3"), {"s1": 9, "s2": 40}, manifest=False, seed=1)
    assert (ablation.abstentions, ablation.keep_handoff, ablation.resamples) == ("error", True, 10_000)
    assert ablation.paired_metrics == ("step_acc",) and ablation.aggregate == "macro"  # source-macro, App. H
    assert "App. H" in ablation.rule and "App. H" in ablation.resamples_reason


@pytest.mark.parametrize(
    ("sizes", "manifest", "aggregate"),
    [
        ({"s1": 40, "s2": 40}, False, "macro"),  # equal quotas: Mini's Macro-5
        ({"s1": 128, "s2": 685}, False, "pooled"),  # natural proportions: Full weights trajectories equally
        ({"s1": 39, "s2": 40}, True, "macro"),  # drawn by a manifest: Mini, even with a trajectory short
        ({"s1": 7}, False, "macro"),
    ],
)
def test_the_headline_aggregate_follows_the_runs_design(
    sizes: dict[str, int], manifest: bool, aggregate: str
) -> None:
    protocol = resolve_protocol(_kinds("rcta", "echo"), sizes, manifest=manifest, seed=1)
    assert protocol.aggregate == aggregate and protocol.aggregate_reason.startswith("auto:")
    forced = resolve_protocol(_kinds("rcta", "echo"), sizes, manifest=manifest, seed=1, aggregate="pooled")
    assert (forced.aggregate, forced.aggregate_reason) == ("pooled", "--aggregate pooled")


def test_flags_override_the_protocol_and_bad_choices_are_refused() -> None:
    kinds = _kinds("rcta", "rcta/no-a1")
    mixed = resolve_protocol(kinds, {}, manifest=False, seed=1, abstentions="fields", keep_handoff=False)
    assert (mixed.name, mixed.abstentions, mixed.keep_handoff) == ("ablation", "fields", False)
    assert "main protocol" in mixed.rule  # the rule is named by what it is, whatever the protocol
    halfway = resolve_protocol(kinds, {}, manifest=False, seed=1, abstentions="fields")
    assert "a mix of the paper's two protocols" in halfway.rule
    with pytest.raises(ConfigError, match="no full RCTA"):
        resolve_protocol(_kinds("rcta/no-a1", "echo"), {}, manifest=False, seed=1, protocol="ablation")
    with pytest.raises(ConfigError, match="component condition"):
        resolve_protocol(_kinds("rcta", "echo"), {}, manifest=False, seed=1, protocol="ablation")
    with pytest.raises(ConfigError, match="--resamples"):
        resolve_protocol(kinds, {}, manifest=False, seed=1, resamples=0)
    with pytest.raises(ConfigError, match="--abstentions"):
        resolve_protocol(kinds, {}, manifest=False, seed=1, abstentions="skip")


# --- the ablation protocol on the component study -------------------------------------------------------------


def test_a_component_study_is_scored_and_tested_by_the_ablation_rules(db: Path) -> None:
    report = _report(db, "study", resamples=300)
    assert report.protocol is not None
    protocol = report.protocol.to_json()
    assert (protocol["name"], protocol["requested"], report.aggregate) == ("ablation", "auto", "macro")
    assert (protocol["abstentions"], protocol["keep_handoff"], protocol["resamples"]) == ("error", True, 300)
    rcta = _metrics(report, "rcta")
    # q0 only for the role (q1's bare sender is another name, q2 abstains); q0 and q1 for the step
    assert (rcta["agent_acc"], rcta["step_acc"], rcta["step_pm5"]) == (1 / 8, 2 / 8, 3 / 8)
    assert (rcta["coverage"], rcta["coverage_rule"]) == (6 / 8, "mixed")
    assert _metrics(report, "rcta/no-a1")["coverage_rule"] == "validity"
    # Four pre-specified tests at most: Step Acc only, every condition against full RCTA, Holm per backbone.
    paired = {p.method_b: p.to_json() for p in report.paired}
    assert set(paired) == {"rcta/no-a1", "rcta/no-a4"}
    assert {(p["metric"], p["family"]) for p in paired.values()} == {("step_acc", "app-h/bb/step_acc")}
    assert (paired["rcta/no-a1"]["wins"], paired["rcta/no-a1"]["losses"]) == (2, 0)
    assert (paired["rcta/no-a4"]["wins"], paired["rcta/no-a4"]["losses"]) == (1, 1)  # q1 against q4
    raw = [mcnemar_exact(2, 0), mcnemar_exact(1, 1)]
    assert [paired[m]["p_mcnemar"] for m in ("rcta/no-a1", "rcta/no-a4")] == raw
    assert [paired[m]["p_holm"] for m in ("rcta/no-a1", "rcta/no-a4")] == holm(raw)
    [family] = protocol["families"]
    assert (family["family"], family["tests"]) == ("app-h/bb/step_acc", 2)
    assert "App. H" in protocol["families"][0]["description"]


def test_the_component_table_follows_table_25(db: Path) -> None:
    components = _report(db, "study", resamples=300).components
    assert (components["reference"], components["conditions"]) == ("rcta", ["rcta/no-a1", "rcta/no-a4"])
    assert (components["abstentions"], components["keep_handoff"], components["aggregate"]) == (
        "error",
        True,
        "macro",
    )
    rows = {row["method"]: row for row in components["rows"]}
    assert [row["ablation"] for row in components["rows"]] == [None, "no-a1", "no-a4"]
    assert rows["rcta"]["delta"] is None and rows["rcta"]["step_acc"] == 2 / 8
    # MAE over non-abstaining outputs with in-range steps: q2 abstains, so 7 of 8; per source |r̂ − r*|:
    # s1 (q0, q1, q3) 0, 0, 2 → 2/3; s2 (q4–q7) 20 each → 20; macro (2/3 + 20) / 2.
    assert rows["rcta"]["valid_step_n"] == 7 and rows["rcta"]["root_mae"] == pytest.approx((2 / 3 + 20) / 2)
    # Δ is the condition minus full RCTA; W/L counts condition-only / full-only.
    assert rows["rcta/no-a1"]["delta"] == pytest.approx(-2 / 8)
    assert (rows["rcta/no-a1"]["wins"], rows["rcta/no-a1"]["losses"]) == (0, 2)
    assert rows["rcta/no-a4"]["delta"] == pytest.approx(0.0)
    assert rows["rcta/no-a1"]["ci_low"] <= rows["rcta/no-a1"]["delta"] <= rows["rcta/no-a1"]["ci_high"]
    raw = [mcnemar_exact(0, 2), mcnemar_exact(1, 1)]
    assert [rows[m]["p_holm"] for m in ("rcta/no-a1", "rcta/no-a4")] == holm(raw)


def test_the_main_protocol_scores_what_an_abstaining_output_gives(db: Path) -> None:
    report = _report(db, "study", protocol="main", resamples=300)
    assert (report.protocol.name, report.protocol.reason) == ("main", "--protocol main")
    rcta = _metrics(report, "rcta")
    assert (rcta["agent_acc"], rcta["step_acc"]) == (3 / 8, 3 / 8)  # q0, q1 (suffix dropped), q2 (abstained)
    assert rcta["coverage"] == 6 / 8  # the abstention still covers nothing
    # The conditions are compared in the component table, under its own rules, and nowhere else.
    assert report.paired == [] and report.complementarity == []
    assert {row.method for row in report.protocol.not_compared} == {"rcta/no-a1", "rcta/no-a4"}
    assert report.components["abstentions"] == "error" and report.components["resamples"] == 300
    assert {row["method"]: row["step_acc"] for row in report.components["rows"]}["rcta"] == 2 / 8


def test_flags_choose_each_rule_apart(db: Path) -> None:
    report = _report(db, "study", abstentions="fields", resamples=50)
    assert report.protocol.name == "ablation"
    rcta = _metrics(report, "rcta")
    # fields kept (q2 counts), suffixes kept (q1's bare sender does not)
    assert (rcta["agent_acc"], rcta["step_acc"]) == (2 / 8, 3 / 8)
    assert "a mix of the paper's two protocols" in report.protocol.scoring_rule
    loose = _metrics(_report(db, "study", keep_handoff=False, resamples=50), "rcta")
    assert loose["agent_acc"] == 2 / 8  # q0 and q1; q2's abstention is an error again


def test_a_mixed_run_gets_the_main_protocol_and_the_component_table(db: Path) -> None:
    report = _report(db, "mixed", resamples=100)
    assert report.protocol.name == "main" and "component study" in report.protocol.reason
    assert {p.method_b for p in report.paired} == {"aao"}
    assert {p.family for p in report.paired} == {"app-b/agent_acc", "app-b/step_acc"}
    assert [row["method"] for row in report.components["rows"]] == ["rcta", "rcta/no-a1", "rcta/no-a4"]
    forced = _report(db, "mixed", protocol="ablation", resamples=100)
    assert {p.method_b for p in forced.paired} == {"rcta/no-a1", "rcta/no-a4"}
    assert [r.method for r in forced.protocol.not_compared] == ["aao"]


# --- the main protocol's Holm family (App. B) ------------------------------------------------------------------


def _families(report: Report) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in report.paired:
        found.setdefault(entry.family or "", []).append(entry.to_json())
    return found


def test_holm_runs_over_the_papers_family_not_every_comparison(db: Path) -> None:
    report = _report(db, "main", resamples=200)
    assert report.protocol.name == "main" and report.aggregate == "pooled"
    families = _families(report)
    # App. B: RCTA against the paper's baselines (aao, echo) on both backbones; self-consistency apart.
    assert {f: len(e) for f, e in families.items()} == {
        "app-b/agent_acc": 4,
        "app-b/step_acc": 4,
        "other/agent_acc": 2,
        "other/step_acc": 2,
    }
    for entries in families.values():
        assert [e["p_holm"] for e in entries] == holm([e["p_mcnemar"] for e in entries])
    # Holm-40's analogue: App. B's family over both metrics together.
    app_b = families["app-b/agent_acc"] + families["app-b/step_acc"]
    assert [e["p_holm_joint"] for e in app_b] == holm([e["p_mcnemar"] for e in app_b])
    assert all(e["p_holm_joint"] is None for e in families["other/step_acc"])
    assert {e["method_b"] for e in families["other/step_acc"]} == {"sc"}


def test_app_b_s_family_leaves_self_hosted_backbones_out_by_default(tmp_path: Path) -> None:
    # App. B's Holm-20/40: four API backbones x five baselines, the self-hosted Qwen left out.
    db = tmp_path / "results.db"
    build_run(
        db,
        "mixed",
        MAIN,
        _main_predictions(),
        methods=MAIN_METHODS,
        backbones={"b1": "deepseek", "b2": "vllm"},
    )
    report = _report(db, "mixed", resamples=100)
    families = _families(report)
    assert {(e["backbone"], e["method_b"]) for e in families["app-b/step_acc"]} == {
        ("b1", "aao"),
        ("b1", "echo"),
    }
    assert list(report.protocol.holm_backbones) == ["b1"]
    assert "self-hosted b2 left out" in report.protocol.holm_backbones_reason
    text = render_text(report, sections=("paired",))
    assert "self-hosted b2 left out, as App. B leaves out Qwen3.5-35B-A3B" in " ".join(text.split())
    # A run whose backbones are all API ones (or all self-hosted) keeps every one in the family.
    build_run(
        db, "api", MAIN, _main_predictions(), methods=MAIN_METHODS, backbones={"b1": "openai", "b2": "kimi"}
    )
    assert _report(db, "api", resamples=100).protocol.holm_backbones == ("b1", "b2")


def test_holm_backbones_and_holm_family_choose_otherwise(db: Path) -> None:
    narrow = _families(_report(db, "main", resamples=100, holm_backbones=("b1",)))
    assert {(e["backbone"], e["method_b"]) for e in narrow["app-b/step_acc"]} == {
        ("b1", "aao"),
        ("b1", "echo"),
    }
    assert len(narrow["other/step_acc"]) == 4  # b2's baselines and sc on both backbones
    per_metric = _report(db, "main", resamples=100, holm_family="metric")
    families = _families(per_metric)
    assert set(families) == {"metric/agent_acc", "metric/step_acc"} and len(families["metric/step_acc"]) == 6
    assert per_metric.protocol.holm_family == "metric"
    everything = _families(_report(db, "main", resamples=100, holm_family="all"))
    assert set(everything) == {"all"} and len(everything["all"]) == 12


# --- the report says which rule each table used ------------------------------------------------------------


def test_every_scored_table_names_its_rule_in_text_and_html(db: Path) -> None:
    report = _report(db, "mixed", resamples=100)
    text = render_text(report)
    assert "protocol: main (auto: the run holds methods besides RCTA's component study" in text
    assert "paired statistics: 100 bootstrap resamples (--resamples), seed 20260820" in text
    for key in ("accuracy", "full-metrics", "per-source", "paired", "complementarity", "length-groups"):
        section = render_text(report, sections=(key,))
        body = section[section.index("\n\n") :]
        assert "Scoring" in body and "main protocol" in body, key
    components = render_text(report, sections=("components",))
    assert "Scoring rule (component study): abstentions count as errors" in components
    assert "w/o A1" in components and "w/o A4" in components
    # rcta stored `covered` on some outputs, the conditions on none: each one's coverage rule is named
    flat = " ".join(components.split())
    assert "those checks where the method stored them, else role and step validity, for rcta;" in flat
    assert "the scorer's checks (a role of the recorded role set and an in-range step) for the others" in flat
    page = render_html(report)
    assert "Component study" in page and "Scoring rule (component study)" in page
    assert "Scoring rule (main protocol)" in page


def test_the_cli_switch_and_its_refusals(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["report", "--db", str(db), "--resamples", "50"]
    assert main([*base, "--run", "main", "--protocol", "ablation"]) == 2
    assert "--protocol ablation compares RCTA's component conditions" in capsys.readouterr().err
    assert main([*base, "--run", "main", "--holm-backbones", "b1,nope"]) == 2
    assert "--holm-backbones: run 'main' has no backbone 'nope'" in capsys.readouterr().err
    assert (
        main(
            [
                *base,
                "--run",
                "study",
                "--json",
                "--protocol",
                "main",
                "--keep-handoff",
                "--abstentions",
                "error",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert (
        report["protocol"]["name"],
        report["protocol"]["abstentions"],
        report["protocol"]["keep_handoff"],
    ) == (
        "main",
        "error",
        True,
    )
    assert main([*base, "--run", "study", "--json", "--no-keep-handoff"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["protocol"]["name"], report["protocol"]["keep_handoff"]) == ("ablation", False)
    assert main([*base, "--run", "study"]) == 0
    assert "protocol: ablation (auto: the run holds full RCTA and its component conditions only)" in (
        capsys.readouterr().out
    )


def test_the_component_study_flags_cells_that_ran_away_from_the_ablation_settings(tmp_path: Path) -> None:
    def at(preset: str, preds: list[Pred]) -> list[Pred]:
        return [
            Pred(
                p.backbone,
                p.method,
                p.qid,
                p.role,
                p.step,
                p.abstained,
                {**(p.output or {}), "preset": preset},
            )
            for p in preds
        ]

    study = _study_predictions()
    full = at("full", [p for p in study if p.method == "rcta"])
    conditions = at("ablation", [p for p in study if p.method != "rcta"])
    db = tmp_path / "results.db"
    build_run(db, "off", STUDY, [*full, *conditions], methods=STUDY_METHODS)
    build_run(db, "on", STUDY, at("ablation", study), methods=STUDY_METHODS)

    off = _report(db, "off", resamples=50)
    assert off.components["off_settings"] == [{"backbone": "bb", "method": "rcta", "presets": {"full": 8}}]
    text = render_text(off, sections=("components",))
    assert "NOT App. H's settings" in text and "rcta on bb ran at preset 'full' (8)" in text
    on = _report(db, "on", resamples=50)
    assert on.components["off_settings"] == []
    assert "NOT App. H" not in render_text(on, sections=("components",))
