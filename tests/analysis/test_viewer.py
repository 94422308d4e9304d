"""The trajectory viewer's files, read without a browser: layout, the DIR-or-file rule, escaping, verdicts, the
texts written once and only where asked for, and counts checked against results.db by plain SQL."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from analysis.viewer_builders import (
    HOSTILE_QID,
    LONG_TAIL,
    PLAIN_QID,
    PROMPT_MARKER,
    REASONING_MARKER,
    WEIRD_QID,
    ViewerRun,
    build_viewer_run,
)
from rcarun.analysis.viewer import is_site_target
from rcarun.analysis.viewer.site import SITE_MARKER, page_name
from rcarun.analysis.viewer.texts import prompt_text
from rcarun.cli import main


@pytest.fixture(scope="module")
def viewer_run(tmp_path_factory: pytest.TempPathFactory) -> ViewerRun:
    return build_viewer_run(tmp_path_factory.mktemp("viewer"))


@pytest.fixture(scope="module")
def site(viewer_run: ViewerRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site") / "report"
    assert main(["report", "--db", str(viewer_run.db), "--html", str(root), "--resamples", "50"]) == 0
    return root


def _page(site: Path, qid: str) -> str:
    return (site / "t" / f"{page_name(qid)}.html").read_text(encoding="utf-8")


def _data(site: Path, qid: str) -> dict[str, object]:
    text = (site / "t" / f"{page_name(qid)}.data.js").read_text(encoding="ascii")
    prefix = "window.RCARUN_TRAJECTORY = "
    assert text.startswith(prefix)
    return json.loads(text[len(prefix) :].rstrip().rstrip(";"))  # type: ignore[no-any-return]


def _text_file(site: Path, key: str) -> str:
    body = (site / "texts" / key[2:4] / f"{key}.js").read_text(encoding="ascii")
    match = re.fullmatch(r'rcarunText\("([a-z]-[0-9a-f]{64})", (".*")\);\n', body, flags=re.DOTALL)
    assert match is not None and match.group(1) == key
    return json.loads(match.group(2))  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("path", "site"),
    [
        ("report.html", False),
        ("out/Report.HTM", False),
        ("site/", True),
        ("site", True),
        ("site.d", True),
        ("report.html/", True),
    ],
)
def test_dir_or_file_rule(path: str, site: bool) -> None:
    assert is_site_target(path) is site


def test_an_existing_directory_is_a_site_whatever_its_name(tmp_path: Path) -> None:
    (tmp_path / "old.html").mkdir()
    assert is_site_target(str(tmp_path / "old.html"))


def test_page_names_are_safe_and_unique() -> None:
    names = {page_name(q) for q in ("a/b", "a_b", "A/b", "a b", "../../etc", WEIRD_QID)}
    assert len(names) == 6
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name
        assert not name.startswith(".")


def test_site_layout_and_the_aggregate_page_links_to_the_viewer(site: Path) -> None:
    for path in ("index.html", "trajectories.html", "assets/viewer.css", "assets/viewer.js", SITE_MARKER):
        assert (site / path).is_file(), path
    index = (site / "index.html").read_text(encoding="utf-8")
    assert '<a id="viewer-link" href="trajectories.html">' in index
    assert "Accuracy" in index  # the aggregate report itself
    pages = sorted(p.name for p in (site / "t").iterdir())
    assert len(pages) == 6  # three trajectories: a page and a data script each
    # Offline: nothing refers outside the site.
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js"):
            assert not re.search(r"(src|href)=\"(https?:)?//", path.read_text(encoding="utf-8")), path


def test_index_counts_hits_per_trajectory(site: Path) -> None:
    index = (site / "trajectories.html").read_text(encoding="utf-8")
    rows = re.findall(r"<tr>(.*?)</tr>", index.split("<tbody>")[1])
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    by_qid = {re.sub(r"<[^>]+>", "", c[0]).replace(" (roles only)", ""): c for c in cells}
    assert list(by_qid) == [HOSTILE_QID, "odd qid/../Ünï &lt;3&gt;", PLAIN_QID]
    hostile = by_qid[HOSTILE_QID]
    # 3 predictions (one item failed without one): step hits 1 (Coder@3), role hits 1, joint 1, 1 missing.
    assert hostile[1:] == ["hostile", "12", "Coder", "3", "3", "1 / 3", "1 / 3", "1 / 3", "1"]
    assert by_qid[PLAIN_QID][5:9] == ["2", "1 / 2", "2 / 2", "1 / 2"]
    assert "no reference" in by_qid["odd qid/../Ünï &lt;3&gt;"][6]


def test_untrusted_text_is_escaped_everywhere(site: Path) -> None:
    page = _page(site, HOSTILE_QID)
    assert "<img src=x" not in page and "<script>window.__pwned" not in page
    assert "&lt;img src=x onerror=&quot;window.__pwned=1&quot;&gt;" in page
    assert "the coder broke it &lt;b&gt;" in page
    assert "Find the &lt;b&gt;bug&lt;/b&gt;" in page
    weird = _page(site, WEIRD_QID)
    assert '<h1 id="qid">odd qid/../Ünï &lt;3&gt;</h1>' in weird
    # Scripts carry text only as ASCII JSON: no "</script>" can end a script early, whatever the content.
    for path in (site / "t").glob("*.data.js"):
        assert "</" not in path.read_text(encoding="ascii").replace("<\\/", "")


def test_reference_and_verdicts_on_the_trajectory_page(site: Path) -> None:
    page = _page(site, HOSTILE_QID)
    assert re.findall(r'<div class="step ref" id="s-(\d+)">', page) == ["3"]
    assert page.count('<span class="badge ref">reference root</span>') == 1
    rows = re.findall(r'<tr class="pred" id="p-(\d)">(.*?)</tr>', page, flags=re.DOTALL)
    verdicts = {
        index: (
            re.search(r'class="pred-role">(.*?)</td>', row).group(1),  # type: ignore[union-attr]
            re.search(r'class="verdict-role (\w+)">(.*?)</td>', row).groups(),  # type: ignore[union-attr]
            re.sub(r"<[^>]+>", "", re.search(r'pred-step">(.*?)</td>', row).group(1)),  # type: ignore[union-attr]
            re.search(r'class="verdict-step (\w+)">(.*?)</td>', row).groups(),  # type: ignore[union-attr]
        )
        for index, row in rows
    }
    assert verdicts == {
        "0": ("Coder", ("ok", "✓ correct"), "3", ("ok", "✓ exact")),
        "1": ("Planner", ("bad", "✗ wrong"), "5", ("near", "≈ within ±5 (off by 2)")),
        "2": ("—", ("bad", "✗ none given"), "—", ("bad", "✗ abstained")),
        "3": ("—", ("na", "—"), "—", ("na", "—")),
    }
    assert '<span class="flag bad">abstained</span>' in rows[2][1]
    assert "no prediction (failed: retries exhausted)" in rows[3][1]
    # On the step axis: the reference above step 3, and the two predicted steps (3 right, 5 near).
    assert re.search(r'class="mark ref" style="left:29\.167%" href="#s-3"', page)
    assert re.search(r'class="mark pred ok" [^>]*href="#s-3"', page)
    assert re.search(r'class="mark pred near" [^>]*href="#s-5"', page)


def test_long_steps_are_collapsed_and_filled_in_from_the_data_script(site: Path) -> None:
    page = _page(site, HOSTILE_QID)
    assert LONG_TAIL not in page
    assert '<details class="content" data-step="5">' in page
    steps = _data(site, HOSTILE_QID)["steps"]
    assert isinstance(steps, list) and len(steps) == 12
    assert steps[5].endswith(LONG_TAIL)
    assert [i for i, s in enumerate(steps) if s is not None] == [5]  # short steps are in the page already


def test_calls_and_their_texts_are_written_once_and_only_as_files(site: Path) -> None:
    page = _page(site, HOSTILE_QID)
    data = _data(site, HOSTILE_QID)
    assert PROMPT_MARKER not in page and PROMPT_MARKER not in json.dumps(data)
    predictions = data["predictions"]
    assert isinstance(predictions, list)
    first = predictions[0]["calls"]
    assert [(c["attempt"], c["status"], c["prompt_tokens"], c["completion_tokens"]) for c in first] == [
        (1, "length", 120, 64),
        (2, "ok", 120, 30),
    ]
    assert [c["usd"] for c in first] == [0.0125, 0.0075]
    # Both attempts sent the same request: one prompt file.
    assert first[0]["texts"]["prompt"] == first[1]["texts"]["prompt"]
    prompt = _text_file(site, first[1]["texts"]["prompt"])
    assert PROMPT_MARKER in prompt and "── user ──" in prompt and "<i>not markup</i>" in prompt
    assert _text_file(site, first[1]["texts"]["answer"]).startswith('{"reason": "the coder broke it"')
    assert _text_file(site, first[1]["texts"]["reasoning"]) == REASONING_MARKER
    assert "raw" not in first[1]["texts"]  # a readable body is shown as its answer, not again raw
    failed = predictions[3]["calls"]
    assert failed[0]["error"] == "HTTP 503: overloaded"
    assert "overloaded" in _text_file(site, failed[0]["texts"]["raw"])  # an error body stays raw
    assert predictions[3]["output"] is None
    output = _text_file(site, predictions[0]["output"])
    assert json.loads(output)["answer"]["evidence"] == ["step 3", "step 4"]


def test_rewriting_a_site_replaces_it_and_a_foreign_folder_is_refused(
    viewer_run: ViewerRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "site"
    args = ["report", "--db", str(viewer_run.db), "--resamples", "50", "--html"]
    assert main([*args, f"{root}/"]) == 0
    stale = root / "t" / "stale.html"
    stale.write_text("old", encoding="utf-8")
    assert main([*args, str(root)]) == 0
    assert not stale.exists() and (root / "trajectories.html").is_file()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep", encoding="utf-8")
    capsys.readouterr()
    assert main([*args, str(foreign)]) == 2
    assert "not a site rcarun wrote" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_a_html_file_path_keeps_the_single_page(viewer_run: ViewerRun, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert main(["report", "--db", str(viewer_run.db), "--resamples", "50", "--html", str(page)]) == 0
    assert page.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    assert "viewer-link" not in page.read_text(encoding="utf-8")


def test_without_the_dataset_pages_show_roles_only(viewer_run: ViewerRun, tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    db.write_bytes(viewer_run.db.read_bytes())
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE runs SET config_json = ?", (json.dumps({"sweep": {"dataset": "/nowhere"}}),)
        )
    root = tmp_path / "site"
    assert main(["report", "--db", str(db), "--resamples", "50", "--html", str(root)]) == 0
    page = _page(root, HOSTILE_QID)
    assert "the run&#x27;s dataset /nowhere is not on this machine" in page
    assert page.count('<p class="na">content not available</p>') == 12
    assert re.search(
        r'id="s-1"><div class="head"><span class="idx">1</span><span class="role">Coder</span>', page
    )
    assert "(roles only)" in (root / "trajectories.html").read_text(encoding="utf-8")


def test_prompt_text_reads_messages_tools_and_anything_else() -> None:
    request = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "part one"}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "read_step"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "step 4 text"},
        ],
        "temperature": 0.5,
        "schema": {"type": "object"},
    }
    text = prompt_text(json.dumps(request).encode())
    assert text.splitlines()[0] == 'settings: {"temperature": 0.5}'
    assert "── user ──\npart one" in text
    assert '→ tool call {"id": "c1", "name": "read_step"}' in text
    assert "── tool (answers c1) ──\nstep 4 text" in text
    assert "── schema ──" in text
    assert prompt_text(b"not json \xff") == "not json \ufffd"


def test_a_real_sweep_site_agrees_with_results_db(methods_db: Path, tmp_path: Path) -> None:
    root = tmp_path / "site"
    assert main(["report", "--db", str(methods_db), "--resamples", "50", "--html", str(root)]) == 0
    with sqlite3.connect(methods_db) as connection:
        expected = {
            qid: (n, hits, total)
            for qid, n, hits, total in connection.execute(
                "SELECT t.qid, t.n_steps, SUM(p.pred_step = t.ref_step), COUNT(p.qid) FROM trajectories t "
                "JOIN predictions p ON p.run_id = t.run_id AND p.qid = t.qid GROUP BY t.qid"
            )
        }
        calls = dict(connection.execute("SELECT qid, COUNT(*) FROM calls GROUP BY qid").fetchall())
    index = (root / "trajectories.html").read_text(encoding="utf-8")
    shown = {}
    for row in re.findall(r"<tr>(.*?)</tr>", index.split("<tbody>")[1]):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        shown[re.sub(r"<[^>]+>", "", cells[0])] = (
            int(cells[2]),
            int(cells[6].split(" / ")[0]),
            int(cells[5]),
        )
    assert shown == expected
    for qid, count in calls.items():
        data = _data(root, qid)
        assert sum(len(p["calls"]) for p in data["predictions"]) == count  # type: ignore[attr-defined]
        assert all(s is None or isinstance(s, str) for s in data["steps"])  # type: ignore[attr-defined]
