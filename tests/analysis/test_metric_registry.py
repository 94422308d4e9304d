"""Each metric is declared once (`rcarun.analysis.scoring.METRICS`); every list and label table reads it."""

from __future__ import annotations

import dataclasses

from rcarun.analysis import METRIC_NAMES, METRICS, Metrics, fidelity, protocol, sensitivity
from rcarun.analysis.render import model
from rcarun.analysis.scoring import metric_label
from rcarun.cli.analysis import _metrics_table


def test_every_metric_is_a_metrics_field_in_report_order() -> None:
    names = tuple(m.name for m in METRICS)
    fields = tuple(f.name for f in dataclasses.fields(Metrics))
    assert names == METRIC_NAMES
    assert [f for f in fields if f in names] == list(names)
    assert set(fields) - set(names) == {"n", "valid_step_n"}


def test_the_tables_enumerate_the_registry() -> None:
    assert model._METRICS == METRIC_NAMES
    assert [metric_label(m.name) for m in METRICS] == [m.label for m in METRICS]
    assert protocol._MAIN_METRICS == ("agent_acc", "step_acc")
    assert protocol._ABLATION_METRICS == ("step_acc",)
    assert fidelity.CALIBRATION_METRICS == ("agent_acc", "step_acc", "step_pm5")
    assert sensitivity._METRICS == ("step_acc", "step_pm5")


def test_the_score_table_has_a_column_per_metric() -> None:
    row = Metrics(n=4, **{m.name: (0.25 if m.fraction else None) for m in METRICS}, valid_step_n=0)
    header, rule, line = _metrics_table({"pooled": row}).splitlines()
    assert header.split() == ["n", *(m.column for m in METRICS)]
    assert len(rule) == len(header)
    assert line.split() == ["pooled", "4", *("25.0%" if m.fraction else "–" for m in METRICS)]


def test_an_unknown_metric_is_shown_by_its_name() -> None:
    assert metric_label("step_pm2") == "step_pm2"
