"""A method on a local backbone (SOAP) compared with the methods of the chat backbones (issue 18).

SOAP runs on a local backbone where no chat method runs, so the report's per-backbone comparison never pairs it;
``paired_across`` does, on the trajectories both answered (its test split). The run is written row by row and
every number is worked out by hand:

12 trajectories (s1: q0–q5, s2: q6–q11), every root ``Planner`` at step 5. SOAP (on local backbone ``qwen``)
answers its test split q0, q1, q2, q6, q7, q8 and finds only q0. On chat backbone ``c1`` full RCTA finds every
root; on ``c2`` it finds q0, q1, q2, q6 and nothing else. All-at-once (``aao``) finds the even qids on both.
A right answer is right on both the agent and the step, so Agent Acc and Step Acc pair alike.

- rcta@c1 vs soap@qwen on the test split: RCTA alone right on 5, SOAP alone on none: McNemar p = 2 · 2⁻⁵ =
  0.0625; macro over the sources (equal sizes): 1 − 1/6.
- rcta@c2 vs soap@qwen: RCTA alone right on q1, q2, q6: p = 2 · 2⁻³ = 0.25; RCTA's macro (3/3 + 1/3) / 2 = 2/3.
- Holm over the two of a metric (``across/<metric>``): 0.0625 · 2 = 0.125, then max(0.125, 0.25) = 0.25.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis.builders import Pred, Traj, build_run
from rcarun.analysis import Report, ReportOptions, build_report, render_html, render_text
from rcarun.analysis.report import Excluded
from rcarun.analysis.report.model import PairedRow
from rcarun.store import open_store

TRAJS = [Traj(f"q{i}", "s1" if i < 6 else "s2", ref_step=5) for i in range(12)]
TEST_SPLIT = ["q0", "q1", "q2", "q6", "q7", "q8"]
BACKBONES = {"c1": "vllm", "c2": "openai", "qwen": "local"}
METHODS = [{"name": "rcta"}, {"name": "all-at-once", "label": "aao"}, {"name": "soap"}]
SCOPE = {("qwen", "soap", 0): TEST_SPLIT}


def _answer(backbone: str, method: str, qid: str, right: bool) -> Pred:
    return Pred(backbone, method, qid, "Planner" if right else "Coder", 5 if right else 20)


def _chat() -> list[Pred]:
    rcta_c2 = {"q0", "q1", "q2", "q6"}
    return [
        *(_answer("c1", "rcta", t.qid, True) for t in TRAJS),
        *(_answer("c2", "rcta", t.qid, t.qid in rcta_c2) for t in TRAJS),
        *(_answer(b, "aao", t.qid, int(t.qid[1:]) % 2 == 0) for b in ("c1", "c2") for t in TRAJS),
    ]


def _soap(answered: list[str]) -> list[Pred]:
    return [_answer("qwen", "soap", qid, qid == "q0") for qid in answered]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("across") / "results.db"
    build_run(
        path,
        "with-soap",
        TRAJS,
        [*_chat(), *_soap(TEST_SPLIT)],
        methods=METHODS,
        backbones=BACKBONES,
        scopes=SCOPE,
    )
    chat_only = {k: v for k, v in BACKBONES.items() if v != "local"}
    build_run(path, "chat-only", TRAJS, _chat(), methods=METHODS[:2], backbones=chat_only)
    # SOAP answered two of its six: its number is not shown, so it is compared with nothing.
    build_run(
        path,
        "soap-short",
        TRAJS,
        [*_chat(), *_soap(["q0", "q1"])],
        methods=METHODS,
        backbones=BACKBONES,
        scopes=SCOPE,
    )
    return path


def _report(db: Path, run: str, **options: Any) -> Report:
    with open_store(db, read_only=True) as store:
        found = store.run_by_name(run)
        assert found is not None
        return build_report(store, found.run_id, ReportOptions(**options))


def _key(entry: PairedRow) -> tuple[str, str, str, str, str]:
    return (entry.method_a, entry.backbone_a, entry.method_b, entry.backbone_b, entry.metric)


def test_soap_is_compared_with_the_reference_on_each_chat_backbone_on_its_test_split(db: Path) -> None:
    report = _report(db, "with-soap")
    assert report.reference_method == "rcta" and report.aggregate == "macro"
    across = {_key(e): e for e in report.paired_across}
    assert sorted(across) == [
        ("rcta", backbone, "soap", "qwen", metric)
        for backbone in ("c1", "c2")
        for metric in ("agent_acc", "step_acc")
    ]
    for metric in ("agent_acc", "step_acc"):
        c1, c2 = (
            across[("rcta", "c1", "soap", "qwen", metric)],
            across[("rcta", "c2", "soap", "qwen", metric)],
        )
        assert (c1.n, c1.wins, c1.losses) == (6, 5, 0)
        assert (c2.n, c2.wins, c2.losses) == (6, 3, 0)
        assert c1.p_mcnemar == pytest.approx(0.0625) and c2.p_mcnemar == pytest.approx(0.25)
        assert c1.p_holm == pytest.approx(0.125) and c2.p_holm == pytest.approx(0.25)
        assert c1.score_a == 1.0 and c2.score_a == pytest.approx(2 / 3)
        assert c1.score_b == c2.score_b == pytest.approx(1 / 6)
        assert c1.delta == pytest.approx(5 / 6) and c2.delta == pytest.approx(0.5)
        assert c1.ci_low <= c1.delta <= c1.ci_high
        assert c1.family == c2.family == f"across/{metric}" and c1.p_holm_joint is None
    families = {f.family: f.tests for f in report.protocol.families}
    assert families["across/step_acc"] == families["across/agent_acc"] == 2
    # No SOAP in the per-backbone comparisons, which are exactly those of the run without SOAP: a family of
    # its own leaves their Holm p-values as they were.
    assert {e.method_b for e in report.paired} == {"aao"}
    assert report.paired == _report(db, "chat-only").paired
    assert _report(db, "chat-only").paired_across == []


def test_with_soap_as_the_reference_every_chat_method_is_compared_with_it(db: Path) -> None:
    report = _report(db, "with-soap", reference_method="soap")
    across = {_key(e): e for e in report.paired_across if e.metric == "step_acc"}
    assert sorted(across) == [
        ("soap", "qwen", method, backbone, "step_acc")
        for method in ("aao", "rcta")
        for backbone in ("c1", "c2")
    ]
    # SOAP is A now: the wins are the losses above; aao (even qids: q0, q2, q6, q8) alone right on 3.
    assert (
        across[("soap", "qwen", "rcta", "c1", "step_acc")].losses,
        across[("soap", "qwen", "rcta", "c1", "step_acc")].wins,
    ) == (5, 0)
    aao = across[("soap", "qwen", "aao", "c1", "step_acc")]
    assert (aao.n, aao.wins, aao.losses, aao.p_mcnemar) == (6, 0, 3, pytest.approx(0.25))
    # Holm over the four of the metric: 0.0625 (rcta@c1), then three at 0.25.
    holm = sorted(e.p_holm for e in across.values())
    assert holm == pytest.approx([0.25, 0.75, 0.75, 0.75])
    assert report.paired == []  # nothing runs on SOAP's backbone beside it


def test_holm_family_metric_and_all_take_the_comparisons_in(db: Path) -> None:
    by_metric = _report(db, "with-soap", holm_family="metric")
    assert {e.family for e in by_metric.paired_across} == {"metric/agent_acc", "metric/step_acc"}
    tests = {f.family: f.tests for f in by_metric.protocol.families}
    assert tests["metric/step_acc"] == 4  # rcta vs aao on c1 and c2, rcta vs soap from c1 and c2
    everything = _report(db, "with-soap", holm_family="all")
    assert {e.family for e in everything.paired_across} == {"all"}
    assert [f.tests for f in everything.protocol.families] == [8]


def test_a_soap_cell_without_a_shown_number_is_compared_with_nothing(db: Path) -> None:
    report = _report(db, "soap-short")
    assert report.paired_across == []
    assert Excluded("qwen", "soap", "not run") in report.excluded


def test_the_text_and_the_page_show_the_comparisons(db: Path) -> None:
    report = _report(db, "with-soap")
    text = render_text(report)
    assert "between a method on a chat backbone and one on a local backbone" in text
    rows = [line for line in text.splitlines() if "rcta · c1" in line and "soap · qwen" in line]
    assert len(rows) == 2  # Agent Acc and Step Acc
    assert all("+83.3" in row and "5/0" in row and "0.0625" in row and "across/" in row for row in rows)
    page = render_html(report)
    assert "rcta · c2" in page and "soap · qwen" in page and "across/step_acc" in page
