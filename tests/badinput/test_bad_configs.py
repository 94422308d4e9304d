"""Malformed sweep configs: one ``rcarun: <file>: <where>: <what>`` line on stderr, exit 2, and no run left behind.

Every problem here is found before any work starts, so results.db is never created: a run that never began
cannot show up as a running (or stopped) run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rcarun.cli import main

_SWEEP = """
[sweep]
dataset = "{dataset}"
{sweep_extra}

[[methods]]
name = "{method}"
"""

_BACKBONE = """
[backbones.sim]
provider = "simulated"
model = "sim-model"
{endpoint}
{backbone_extra}
"""

_BACKBONES_FILE = """
[sim]
provider = "simulated"
model = "sim-model"
base_url = "http://127.0.0.1:9/v1"
{backbone_extra}
"""

_KNOWN_METHODS = (
    "all-at-once, binary-search, continual-search, echo, falat, judge-panel, passive-continuation, rcta, "
    "rcta/no-a1, rcta/no-a2, rcta/no-a3, rcta/no-a4, self-consistency, soap, step-by-step"
)


@dataclass(frozen=True)
class Case:
    """A sweep config and the message it must produce (``{config}``, ``{dir}``: the file and its directory)."""

    message: str
    top: str = ""
    sweep_extra: str = ""
    method: str = "all-at-once"
    backbone_extra: str = ""
    endpoint: str = 'base_url = "http://127.0.0.1:9/v1"'  # the inline backbone's endpoint line, as TOML
    shared_backbone_extra: str | None = None  # a backbones.toml beside the config, used instead of inline
    dataset: str | None = None
    raw: str | None = None  # the whole file, for syntax errors
    env: dict[str, str] = field(default_factory=dict)

    def write(self, directory: Path, dataset: Path) -> Path:
        config = directory / "sweep.toml"
        if self.raw is not None:
            config.write_text(self.raw)
            return config
        body = self.top + _SWEEP.format(
            dataset=self.dataset or dataset, sweep_extra=self.sweep_extra, method=self.method
        )
        if self.shared_backbone_extra is None:
            body += _BACKBONE.format(endpoint=self.endpoint, backbone_extra=self.backbone_extra)
        else:
            (directory / "backbones.toml").write_text(
                _BACKBONES_FILE.format(backbone_extra=self.shared_backbone_extra)
            )
        config.write_text(body)
        return config


CASES = {
    "unknown top-level key": Case("{config}: bogus: Extra inputs are not permitted", top="bogus = 1\n"),
    "unknown key in [sweep]": Case(
        "{config}: sweep.realisations: Extra inputs are not permitted", sweep_extra="realisations = 2"
    ),
    "unknown key in a backbone": Case(
        "{config}: backbones.sim.max_token: Extra inputs are not permitted", backbone_extra="max_token = 10"
    ),
    "unknown provider": Case(
        "{config}: backbones.glm.provider: unknown provider 'glm' (known: deepseek, kimi, local, openai, "
        "openai-compatible, simulated, vllm)",
        top='[backbones.glm]\nprovider = "glm"\nmodel = "glm-5"\n',
    ),
    "unknown key in a shared backbone": Case(
        "{dir}/backbones.toml: sim.rmp: Extra inputs are not permitted",
        top='backbones_file = "backbones.toml"\nuse = ["sim"]\n',
        shared_backbone_extra="rmp = 60",
    ),
    "negative concurrency": Case(
        "{config}: backbones.sim.limits.concurrency: Input should be greater than or equal to 1",
        backbone_extra="limits = { concurrency = -1 }",
    ),
    "negative rpm": Case(
        "{config}: backbones.sim.limits.rpm: Input should be greater than 0",
        backbone_extra="limits = { rpm = -5 }",
    ),
    "unknown method": Case(
        f"{{config}}: methods[0]: unknown method 'all-at-onse' (known: {_KNOWN_METHODS})",
        method="all-at-onse",
    ),
    "use names a backbone not in the file": Case(
        "{config}: use names backbones not in backbones.toml: ['gpt-9']",
        top='backbones_file = "backbones.toml"\nuse = ["gpt-9"]\n',
        shared_backbone_extra="",
    ),
    "missing API key variable": Case(
        "{config}: backbone 'sim': environment variable RCARUN_TEST_MISSING_KEY (api_key_env) is not set",
        backbone_extra='api_key_env = "RCARUN_TEST_MISSING_KEY"',
    ),
    "missing dataset": Case(
        "{config}: sweep.dataset: {dir}/no-such-dataset: no such file or directory", dataset="no-such-dataset"
    ),
    **{
        f"base_url {url!r}": Case(
            f"{{config}}: backbones.sim.base_url: {url!r} is not an http:// or https:// URL with a host "
            "(e.g. http://127.0.0.1:8000/v1)",
            endpoint=f"base_url = {json.dumps(url)}",
        )
        for url in ("ftp://127.0.0.1/v1", "file:///etc/passwd", "127.0.0.1:18900/v1", "http://", "x")
    },
    **{
        f"base_url {url!r}": Case(
            f"{{config}}: backbones.sim.base_url: {url!r} contains whitespace or control characters",
            endpoint=f"base_url = {json.dumps(url)}",
        )
        for url in ("http://127.0.0.1:9/v1 ", " http://127.0.0.1:9/v1", "http://127.0.0.1:9/\x07v1")
    },
    "base_url with a port that is not a number": Case(
        "{config}: backbones.sim.base_url: 'http://127.0.0.1:port/v1' has an invalid port",
        endpoint='base_url = "http://127.0.0.1:port/v1"',
    ),
    "one bad replica in base_urls": Case(
        "{config}: backbones.sim.base_urls.1: 'https://' is not an http:// or https:// URL with a host "
        "(e.g. http://127.0.0.1:8000/v1)",
        endpoint='base_urls = ["http://127.0.0.1:9/v1", "https://"]',
    ),
    "infinite timeout": Case(
        "{config}: backbones.sim.timeout_s: Input should be a finite number", backbone_extra="timeout_s = inf"
    ),
    "infinite rpm": Case(
        "{config}: backbones.sim.limits.rpm: Input should be a finite number",
        backbone_extra="limits = { rpm = inf }",
    ),
    "nan sweep budget": Case(
        "{config}: budget.max_usd: Input should be a finite number", top="budget = { max_usd = nan }\n"
    ),
    "infinite number in extra_body": Case(
        "{config}: backbones.sim.extra_body.sampling.top_p: Input should be a finite number",
        backbone_extra="extra_body = { sampling = { top_p = -inf } }",
    ),
    **{
        f"price window {start}-{end}": Case(
            f"{{config}}: backbones.sim.prices.windows.0.{key}: '{bad}' is not a UTC time of day HH:MM "
            "(00:00 .. 23:59)",
            backbone_extra=f'prices = {{ windows = [{{ start = "{start}", end = "{end}", '
            "input_per_mtok = 1, output_per_mtok = 2 }] }",
        )
        for start, end, key, bad in (
            ("25:00", "01:00", "start", "25:00"),
            ("22:00", "24:00", "end", "24:00"),
            ("9:00", "10:00", "start", "9:00"),
            ("09:60", "10:00", "start", "09:60"),
            ("09:00", "10:00:00", "end", "10:00:00"),
            ("noon", "13:00", "start", "noon"),
        )
    },
    "empty price window": Case(
        "{config}: backbones.sim.prices.windows.0.end: start and end are both 06:00: the window is empty",
        backbone_extra='prices = { windows = [{ start = "06:00", end = "06:00", input_per_mtok = 1, '
        "output_per_mtok = 2 }] }",
    ),
    **{
        f"literal {header} header": Case(
            f"{{config}}: backbones.sim.extra_headers.{header}: a literal credential header; "
            "secrets come only from environment variables: use api_key_env",
            backbone_extra=f'extra_headers = {{ "{header}" = "{value}" }}',
        )
        for header, value in (
            ("Authorization", "Bearer " + "abcdefghijklmnop"),
            ("authorization", "short"),
            ("X-Api-Key", "k" * 32),
            ("X-Auth-Token", "t" * 32),
            ("X-Client-SECRET", "s"),
        )
    },
    **{
        f"secret-looking value at {where}": Case(
            f"{{config}}: backbones.sim.{where}: looks like a secret (Bearer token or sk- key); "
            "secrets come only from environment variables: use api_key_env",
            backbone_extra=extra,
        )
        for where, extra in (
            ("extra_headers.X-Forward", 'extra_headers = { X-Forward = "Bearer ' + "a1b2c3d4e5f6" + '" }'),
            ("extra_body.metadata.user", 'extra_body = { metadata = { user = "sk-' + "x" * 20 + '" } }'),
            ("extra_body.stop.1", 'extra_body = { stop = ["END", "use bearer ' + "Zz9" * 4 + ' now"] }'),
        )
    },
    "TOML syntax error": Case(
        "{config}: not valid TOML: Expected '=' after a key in a key/value pair (at line 2, column 9)",
        raw="[sweep]\ndataset \n",
    ),
}


def _expected(case: Case, config: Path) -> str:
    return "rcarun: " + case.message.format(config=config, dir=config.parent)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_config_is_one_line_naming_file_and_key_and_leaves_no_run(
    case: Case,
    small_dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RCARUN_TEST_MISSING_KEY", raising=False)
    monkeypatch.delenv("RCARUN_DB", raising=False)
    config = case.write(tmp_path, small_dataset)
    db = tmp_path / "results.db"

    code = main(["sweep", "--config", str(config), "--db", str(db), "--no-progress"])

    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.splitlines() == [_expected(case, config)]
    assert captured.out == ""
    assert not db.exists()
    for secret in ("abcdefghijklmnop", "k" * 32, "a1b2c3d4e5f6", "x" * 20, "Zz9" * 4):
        assert secret not in captured.err  # a refused secret is named by its place, never quoted


def test_a_missing_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "nope.toml"

    assert main(["sweep", "--config", str(config), "--db", str(tmp_path / "r.db"), "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"rcarun: {config}: no such file"]


@pytest.mark.parametrize("name", ["missing API key variable", "unknown method"])
def test_no_traceback_reaches_the_terminal(name: str, small_dataset: Path, tmp_path: Path) -> None:
    case = CASES[name]
    config = case.write(tmp_path, small_dataset)
    db = tmp_path / "results.db"
    env = {key: value for key, value in os.environ.items() if key != "RCARUN_TEST_MISSING_KEY"}

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rcarun.cli",
            "sweep",
            "--config",
            str(config),
            "--db",
            str(db),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )

    assert result.returncode == 2
    assert result.stderr.splitlines() == [_expected(case, config)]
    assert "Traceback" not in result.stdout + result.stderr
    assert not db.exists()
