"""SOAP in a sweep: a local backbone beside a simulated chat backbone, on the bundled sample (issue 18).

The local backbone is the seeded random tiny model (its answers mean nothing); what is checked is the path:
configs refused in one line, splits owned by the run, items made of the test split only, every forward pass a
``calls`` row, passes served from the cache beside results.db on a rerun, a failing pass failing its item and
not the sweep, and the report scoring SOAP on its test split.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from helpers.sweeps import rows
from rcarun.cli import main
from rcarun.data import Trajectory, bundled_sample_path
from rcarun.errors import ConfigError
from rcarun.methods import Attribution, create_method, method, registry, speaker_attribution
from rcarun.methods.base import Method, ModelFor, Preparation, TrajectorySet
from rcarun.methods.forward import ForwardModel
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, run_sweep
from rcarun.runner.local_model import forward_cache_dir
from rcarun.runner.wiring import check_method_backbones

torch = pytest.importorskip("torch")

# Passes of 1,024 tokens: the byte-level tokenizer reads the sample's long trajectories in windows, cheaply.
_CONTEXT = 1024
_LOCAL = "tiny-random-local"


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(
    chat_url: str | None,
    *,
    soap: Mapping[str, Any] | None = None,
    realizations: int = 1,
    forward_cache: str = "float16",
    methods: Sequence[Mapping[str, Any]] | None = None,
) -> SweepConfig:
    backbones: dict[str, Any] = {
        _LOCAL: {"provider": "local", "model": "tiny", "local": {"device": "cpu", "context_tokens": _CONTEXT}}
    }
    chosen = list(methods or [{"name": "soap", "options": {"context_tokens": _CONTEXT, **(soap or {})}}])
    if chat_url is not None:
        backbones["sim"] = {"provider": "simulated", "model": "sim-model", "base_url": chat_url}
        chosen.append({"name": "all-at-once"})
    return SweepConfig.model_validate(
        {
            "sweep": {
                "dataset": str(bundled_sample_path()),
                "realizations": realizations,
                "forward_cache": forward_cache,
            },
            "methods": chosen,
            "backbones": backbones,
        }
    )


def _predictions(db: Path, run: str) -> list[tuple[Any, ...]]:
    return rows(
        db,
        "SELECT p.realization, p.qid, p.pred_step, p.output_json FROM predictions p JOIN runs USING (run_id) "
        "WHERE runs.name = ? AND p.method = 'soap' ORDER BY 1, 2",
        (run,),
    )


def _prepared(db: Path) -> list[dict[str, Any]]:
    found = rows(db, "SELECT detail_json FROM run_events WHERE kind = 'method_prepared' ORDER BY event_id")
    return [json.loads(detail) for (detail,) in found]


# -- configuration ---------------------------------------------------------------------------------------------


def test_a_local_backbone_needs_no_endpoint_and_refuses_one() -> None:
    ok = _config(None)
    assert ok.backbones[_LOCAL].is_local and ok.backbones[_LOCAL].local_settings.local_files_only
    assert "random weights" in ok.backbones[_LOCAL].model_label
    refusals = {
        "base_url": ({"base_url": "http://127.0.0.1:1/v1"}, "remove base_url"),
        "key": ({"api_key_env": "KEY"}, "needs no key"),
        "unknown local key": ({"local": {"devise": "cpu"}}, "devise"),
    }
    for extra, expected in refusals.values():
        with pytest.raises(ValueError, match=expected):
            SweepConfig.model_validate(
                {
                    "sweep": {"dataset": "x"},
                    "methods": [{"name": "soap"}],
                    "backbones": {"l": {"provider": "local", "model": "tiny", **extra}},
                }
            )
    with pytest.raises(ValueError, match="applies to provider 'local' only"):
        SweepConfig.model_validate(
            {
                "sweep": {"dataset": "x"},
                "methods": [{"name": "all-at-once"}],
                "backbones": {
                    "c": {
                        "provider": "vllm",
                        "model": "m",
                        "base_url": "http://h/v1",
                        "local": {"device": "cpu"},
                    }
                },
            }
        )


def test_methods_and_backbones_of_the_other_kind_are_refused_in_one_line() -> None:
    soap = create_method("soap")
    chat = create_method("all-at-once")
    only_local = _config(None)
    with pytest.raises(ConfigError, match=r"no backbone of the sweep can run \['all-at-once'\]"):
        check_method_backbones([soap, chat], only_local)
    with_chat = _config("http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match=r"local backbones \['tiny-random-local'\] have no method to run"):
        check_method_backbones([chat], with_chat)
    without_local = with_chat.model_copy(update={"backbones": {"sim": with_chat.backbones["sim"]}})
    with pytest.raises(ConfigError, match=r"no backbone of the sweep can run \['soap'\]"):
        check_method_backbones([soap, chat], without_local)
    panel = create_method("judge-panel", options={"judges": ["sim", _LOCAL]})
    with pytest.raises(ConfigError, match="names local backbones"):
        check_method_backbones([soap, panel], with_chat)
    check_method_backbones([soap, chat], with_chat)  # one of each kind: runs


def test_soap_options_are_strict_and_refuse_a_chat_llm() -> None:
    with pytest.raises(ConfigError, match="band must be"):
        create_method("soap", options={"band": [4, 2]})
    with pytest.raises(ConfigError, match="exceed 1"):
        create_method("soap", options={"train_fraction": 0.7, "validation_fraction": 0.5})
    with pytest.raises(ConfigError, match="unknown option"):
        create_method("soap", options={"gama": 0.6})
    assert create_method("soap").reads_model and not create_method("all-at-once").reads_model


def test_a_missing_local_extra_is_one_config_error_line(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(
        f'[sweep]\ndataset = "{bundled_sample_path()}"\n[[methods]]\nname = "soap"\n'
        '[backbones.l]\nprovider = "local"\nmodel = "tiny"\n'
    )
    script = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if the extra were not installed\n"
        "from rcarun.cli import main\n"
        f"sys.exit(main(['sweep', '--config', {str(config)!r}, '--db', {str(tmp_path / 'r.db')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"rcarun: {config}: the local model backend needs torch (import of torch halted; None in sys.modules): "
        "pip install 'rcarun[local]'"
    ]
    assert not (tmp_path / "r.db").exists() or rows(tmp_path / "r.db", "SELECT count(*) FROM runs") == [(0,)]


# -- end to end ------------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_soap_beside_all_at_once_answers_only_its_test_split_and_records_every_pass(
    tmp_path: Path, sample_qids: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01)) as server:
        config = _config(server.base_url, realizations=2)
        outcome = await run_sweep(config, db_path=db, run_name="first", show_progress=False)
        assert outcome.status == "finished"
        rerun = await run_sweep(config, db_path=db, run_name="second", show_progress=False)
    assert rerun.status == "finished"

    prepared = _prepared(db)
    assert [(p["backbone"], p["method"], p["realization"], p["seed"]) for p in prepared[:2]] == [
        (_LOCAL, "soap", 0, 0),
        (_LOCAL, "soap", 1, 1),
    ]
    for preparation in prepared[:2]:
        parts: dict[str, set[str]] = {"reference": set(), "unused": set(), "validation": set(), "test": set()}
        for source, detail in preparation["sources"].items():
            assert "failed" not in detail
            assert detail["reference_steps"] > 0 and detail["reference_rank"] > 0
            assert detail["selection"]["validation"] >= 1 and detail["selection"]["stage1"]
            assert all(qid.startswith(source) for part in parts for qid in detail["split"][part])
            for part in parts:
                parts[part] |= set(detail["split"][part])
        assert set().union(*parts.values()) == set(sample_qids)
        assert sum(len(p) for p in parts.values()) == len(sample_qids)  # disjoint
        assert set(preparation["items"]) == parts["test"] and len(parts["test"]) == 5
    # Items, and so predictions, only of the test split of each realization: nothing SOAP learnt from.
    predicted = rows(
        db, "SELECT realization, qid FROM predictions WHERE method = 'soap' AND run_id = 1 ORDER BY 1, 2"
    )
    assert predicted == sorted((p["realization"], q) for p in prepared[:2] for q in p["items"])
    assert rows(db, "SELECT count(*) FROM predictions WHERE method = 'all-at-once' AND run_id = 1") == [(20,)]

    # Every pass is a row: tokens, latency, no USD; the request blob is the segments, the response a summary.
    passes = rows(
        db,
        "SELECT stage, status, prompt_tokens, completion_tokens, cost_usd, request_sha256, response_sha256, "
        "model, cache_key FROM calls WHERE backbone = ? AND run_id = 1",
        (_LOCAL,),
    )
    assert {stage for stage, *_ in passes} == {"forward", "forward/reference", "forward/validation"}
    assert all(tokens > 0 and completion == 0 and usd == 0 for _, _, tokens, completion, usd, *_ in passes)
    assert all(model.startswith("tiny-random-llama(seed=0") for *_, model, _ in passes)
    # Realization 1 meets passes realization 0 ran (a trajectory in both test splits): served from the cache.
    assert {status for _, status, *_ in passes} == {"ok", "cached"}
    with sqlite3.connect(db) as connection:
        request_sha, response_sha = passes[0][5], passes[0][6]
        stored = {
            sha: json.loads(text if text is not None else zlib_decompress(data))
            for sha, data, text in connection.execute(
                "SELECT sha256, zlib_data, text FROM blobs WHERE sha256 IN (?, ?)",
                (request_sha, response_sha),
            )
        }
    assert stored[request_sha]["segments"][0].startswith("Task: ")
    summary = stored[response_sha]
    assert (
        summary["tokens"] == passes[0][2]
        and summary["pooled"][0] == 4
        and summary["pooled_kept_as"] == "float16"
    )
    cache = forward_cache_dir(db)
    assert (cache / summary["file"]).is_file()
    assert len(list(cache.glob("*.npz"))) == len({key for *_, key in passes})
    assert not list(cache.glob("*.tmp"))

    # A second run of the same sweep recomputes nothing and answers exactly as the first.
    statuses = rows(db, "SELECT DISTINCT status FROM calls WHERE backbone = ? AND run_id = 2", (_LOCAL,))
    assert statuses == [("cached",)]
    assert _predictions(db, "second") == _predictions(db, "first")

    # The report scores SOAP on its test split: 5 trajectories a realization, not the run's 10.
    assert main(["report", "--db", str(db), "--run", "first", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    outcomes = {(o["backbone"], o["method"], o["realization"]): o for o in report["outcomes"]}
    assert outcomes[(_LOCAL, "soap", 0)]["expected"] == outcomes[(_LOCAL, "soap", 1)]["expected"] == 5
    assert outcomes[("sim", "all-at-once", 0)]["expected"] == 10
    assert all(o["predictions"] == o["expected"] for o in outcomes.values())
    (soap,) = [m for m in report["metrics"] if m["method"] == "soap" and m["realization"] == 0]
    assert soap["status"] == "complete" and soap["n"] == 5
    (repeat,) = [r for r in report["repeatability"] if r["method"] == "soap"]
    assert repeat["realizations"] == [0, 1]
    assert all(0 < a["n"] < 5 for a in repeat["agreement"])  # the split seeds' test splits overlap in part


@pytest.mark.slow
async def test_without_the_cache_every_pass_runs_and_float32_answers_as_no_cache(tmp_path: Path) -> None:
    soap = {"layer": 3, "band": [0, 4], "attention": "early", "window": 2, "gamma": 0.6}
    kept = tmp_path / "kept.db"
    off = tmp_path / "off.db"
    await run_sweep(
        _config(None, soap=soap, forward_cache="float32"), db_path=kept, run_name="r", show_progress=False
    )
    await run_sweep(
        _config(None, soap=soap, forward_cache="off"), db_path=off, run_name="r", show_progress=False
    )
    await run_sweep(
        _config(None, soap=soap, forward_cache="off"), db_path=off, run_name="r2", show_progress=False
    )
    assert not forward_cache_dir(off).exists()
    assert rows(off, "SELECT count(*) FROM calls WHERE status = 'cached'") == [(0,)]
    assert _predictions(off, "r2") == _predictions(off, "r") == _predictions(kept, "r")
    # Fixed hyperparameters: no selection, no validation pass; the configuration is the one given.
    (preparation,) = _prepared(kept)
    for detail in preparation["sources"].values():
        assert detail["selection"] is None
        assert (detail["config"]["layer"], detail["config"]["band"], detail["config"]["gamma"]) == (
            3,
            [0, 4],
            0.6,
        )
    assert rows(kept, "SELECT count(*) FROM calls WHERE stage = 'forward/validation'") == [(0,)]


@pytest.mark.slow
async def test_a_source_that_cannot_be_prepared_fails_its_test_items_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # No validation split and nothing fixed: there is nothing to choose the hyperparameters with.
    config = _config(None, soap={"validation_fraction": 0.0, "train_fraction": 0.5})
    outcome = await run_sweep(config, db_path=db, run_name="r", show_progress=False)
    assert outcome.status == "finished"
    failed = rows(db, "SELECT qid, error FROM items WHERE status = 'failed'")
    assert len(failed) == 5 and rows(db, "SELECT count(*) FROM predictions") == [(0,)]
    assert all(
        error.startswith("ConfigError: SOAP could not be prepared for source")
        and "at least one validation trajectory" in error
        for _, error in failed
    )


@pytest.mark.slow
async def test_a_resumed_sweep_answers_only_what_is_left_from_the_cache(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    config = _config(None, soap={"layer": 3, "band": [0, 4], "attention": "early", "window": 2, "gamma": 0.6})
    await run_sweep(config, db_path=db, run_name="r", show_progress=False)
    before = _predictions(db, "r")
    lost = before[0][1]
    with sqlite3.connect(db) as connection:  # as if the sweep had been killed before this item finished
        connection.execute("DELETE FROM predictions WHERE qid = ?", (lost,))
        connection.execute("DELETE FROM items WHERE qid = ?", (lost,))
    calls_before = rows(db, "SELECT max(call_id) FROM calls")[0][0]
    outcome = await run_sweep(config, db_path=db, run_name="r", show_progress=False)
    assert outcome.counters[_LOCAL].items_done == 1
    assert _predictions(db, "r") == before
    resumed = rows(db, "SELECT qid, stage, status FROM calls WHERE call_id > ?", (calls_before,))
    # The preparation is made again (its reference read back from the cache), then only the lost item runs.
    assert resumed and {status for *_, status in resumed} == {"cached"}
    assert {qid for qid, stage, _ in resumed if stage == "forward"} == {lost}
    assert {stage for _, stage, _ in resumed} == {"forward", "forward/reference"}


# -- a failing pass --------------------------------------------------------------------------------------------


class _TooLong(Method):
    """Reads one trajectory in a pass longer than the model allows: the pass fails, and so does its item."""

    reads_model = True

    def __init__(self, label: str, options: Mapping[str, Any]) -> None:
        self.label = label

    async def attribute(self, trajectory: Trajectory, llm: Any) -> Attribution:
        raise AssertionError("never chats")

    async def prepare(
        self, trajectories: TrajectorySet, model_for: ModelFor, realization: int
    ) -> Preparation:
        async def attribute(trajectory: Trajectory, model: ForwardModel) -> Attribution:
            size = 10 * model.context_tokens if trajectory.qid == "hand_crafted/4" else 10
            await model.encode(["x" * size])
            return speaker_attribution(trajectory, 0, {})

        return Preparation(items=trajectories.ids, detail={}, attribute=attribute)


async def test_a_failing_pass_fails_its_item_and_the_sweep_goes_on(tmp_path: Path) -> None:
    name = "test-too-long"
    method(name)(_TooLong)
    try:
        db = tmp_path / "results.db"
        config = _config(None, methods=[{"name": name}])
        outcome = await run_sweep(config, db_path=db, run_name="r", show_progress=False)
    finally:
        registry._REGISTRY.pop(name, None)
    assert outcome.status == "finished"
    assert outcome.counters[_LOCAL].items_done == 9 and outcome.counters[_LOCAL].items_failed == 1
    ((qid, error),) = rows(db, "SELECT qid, error FROM items WHERE status = 'failed'")
    assert qid == "hand_crafted/4"
    assert error.startswith("ForwardPassFailed: forward pass over 1 segments on tiny-random-llama")
    assert "exceed context_tokens=1024" in error and "\n" not in error
    ((status, kind, recorded),) = rows(
        db, "SELECT status, error_kind, error FROM calls WHERE qid = ?", (qid,)
    )
    assert (status, kind) == ("error", "forward_failed") and recorded == error.removeprefix(
        "ForwardPassFailed: "
    )


def zlib_decompress(data: bytes) -> bytes:
    import zlib

    return zlib.decompress(data)
