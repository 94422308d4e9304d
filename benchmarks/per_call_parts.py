"""The per-call parts issue 17 changed, each timed beside what it replaced, in one process.

End-to-end CPU per call on this shared 2-core machine spreads over ±20 % from run to run (docs/performance.md,
"CPU per call"), more than any one part's share, so each part is also timed alone: the best of several
``timeit`` repeats, old and new interleaved. Usage:

    .venv/bin/python benchmarks/per_call_parts.py

Parts: rendering a request (the canonical JSON and the body sent: the standard library against
`rcarun.jsonfast`), on the bench's small prompts and on a 350-KB prompt; compressing a stored blob (zlib level
6 against 1) on a bench request body and on the bundled Who&When trajectories, with the sizes; and (issue 19)
what the store writer does with each new blob, compressing it (level 1, before migration 4) against
`rcarun.store.blobs.blob_columns` (text up to 64 KiB kept as is, larger blobs compressed); and (later) a row's
timestamp and the call cache key, each before and after; and (later still) reading a trajectory file (``open``
against `rcarun.data.loaders`' four system calls), parsing JSON (``json`` against `rcarun.jsonfast.loads`),
filling the all-at-once prompt (`string.Template` against `rcarun.methods.prompt_files.PromptTemplate`) and
normalising an agent's name (computed against remembered).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import timeit
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from string import Template
from typing import Any

import rcarun.data
from rcarun import jsonfast
from rcarun.data.loaders import _read_file as read_file
from rcarun.data.roles import _normal_form, normalize_role
from rcarun.methods.prompt_files import load_prompt
from rcarun.runner.cache import call_cache_key
from rcarun.store.blobs import blob_columns, compress_blob
from rcarun.store.rows import utc_timestamp


def best_us(function: Callable[[], Any], number: int, repeat: int = 7) -> float:
    """The best of ``repeat`` timings of ``number`` runs, in microseconds per run."""
    return min(timeit.repeat(function, number=number, repeat=repeat)) / number * 1e6


def _body(prompt_chars: int, rng: random.Random) -> dict[str, Any]:
    words = ["the", "agent", "step", "file", "résultat", "→", "error", "search", "Coder", "Verifier"]
    text = " ".join(rng.choice(words) for _ in range(prompt_chars // 6))[:prompt_chars]
    schema = {
        "type": "object",
        "properties": {
            "agent": {"type": "string", "enum": ["Planner", "Coder", "Computer_terminal", "Verifier"]},
            "step": {"type": "integer", "minimum": 0},
            "reason": {"type": "string"},
        },
        "required": ["agent", "step", "reason"],
        "additionalProperties": False,
    }
    return {
        "model": "sim-bench",
        "messages": [
            {"role": "system", "content": "You find the decisive error."},
            {"role": "user", "content": text},
        ],
        "max_tokens": 512,
        "temperature": 0.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "attribution", "schema": schema}},
    }


def _add_loading_and_prompt_parts(
    rows: list[tuple[str, float, float]], trajectories: list[bytes], response: bytes
) -> None:
    """The parts of the later cut: reading a trajectory file, parsing JSON, filling a prompt, a role's name."""
    with tempfile.TemporaryDirectory(prefix="rcarun-parts-") as tmp:
        files = []
        for index, blob in enumerate(trajectories):
            file = os.path.join(tmp, f"{index}.json")
            Path(file).write_bytes(blob)
            files.append(file)

        def read_with_open() -> None:
            for file in files:
                with open(file, "rb") as handle:
                    handle.read()

        rows.append(
            (
                f"read each bundled Who&When file ({len(files)})",
                best_us(read_with_open, 200) / len(files),
                best_us(lambda: [read_file(file) for file in files], 200) / len(files),
            )
        )
    for label, document, number in (
        ("parse a bundled Who&When file", trajectories[0], 2_000),
        (f"parse a raw response body ({len(response):,} B)", response, 20_000),
    ):
        rows.append(
            (
                label,
                best_us(lambda document=document: json.loads(document), number),  # type: ignore[misc]
                best_us(lambda document=document: jsonfast.loads(document), number),  # type: ignore[misc]
            )
        )
    prompt = load_prompt("all_at_once_user.txt")
    names = {
        "task": "Find the value asked for and report it.",
        "ground_truth": "",
        "agents": "Orchestrator, WebSurfer, Coder",
        "n_steps": 7,
        "step_format": 'Each step is shown as "[step k] agent: content".',
        "log": "[step 0] Orchestrator: plan\n" * 30,
        "truncation_note": "",
        "schema": json.dumps(_body(0, random.Random(0))["response_format"], ensure_ascii=False),
    }
    rows.append(
        (
            "fill the all-at-once prompt",
            best_us(lambda: Template(prompt.template).substitute(**names), 20_000),
            best_us(lambda: prompt.substitute(**names), 20_000),
        )
    )
    rows.append(
        (
            "normalise an agent's name",
            best_us(lambda: _normal_form("WebSurfer (-> Coder)", False), 100_000),
            best_us(lambda: normalize_role("WebSurfer (-> Coder)"), 100_000),
        )
    )


def main() -> None:
    rng = random.Random(17)
    rows: list[tuple[str, float, float]] = []
    for label, chars, number in (("bench prompt (800 chars)", 800, 20_000), ("350-KB prompt", 350_000, 50)):
        body = _body(chars, rng)
        rows.append(
            (
                f"render a request twice, {label}",
                best_us(
                    lambda body=body: (  # type: ignore[misc]
                        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(),
                        json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
                    ),
                    number,
                ),
                best_us(
                    lambda body=body: (jsonfast.dumps_canonical(body), jsonfast.dumps_compact(body)), number
                ),
            )
        )
    sample = sorted((Path(rcarun.data.__file__).parent / "samples" / "who_and_when").rglob("*.json"))
    trajectories = [path.read_bytes() for path in sample]
    bench_blob = json.dumps(_body(800, rng), ensure_ascii=False).encode()
    rows.append(
        (
            f"compress a bench request body ({len(bench_blob):,} B)",
            best_us(lambda: zlib.compress(bench_blob, 6), 5_000),
            best_us(lambda: zlib.compress(bench_blob, 1), 5_000),
        )
    )
    average = sum(map(len, trajectories)) // len(trajectories)
    rows.append(
        (
            f"compress each bundled Who&When file ({len(trajectories)}, {average:,} B on average)",
            best_us(lambda: [zlib.compress(blob, 6) for blob in trajectories], 20) / len(trajectories),
            best_us(lambda: [zlib.compress(blob, 1) for blob in trajectories], 20) / len(trajectories),
        )
    )
    # The writer's part of a call: one blob per request (and one per raw response) turned into the row it stores.
    response = json.dumps(
        {
            "choices": [
                {"message": {"content": json.dumps({"agent": "Coder", "step": 3, "reason": "x" * 400})}}
            ]
        }
    ).encode()
    long_prompt = json.dumps(_body(100_000, rng), ensure_ascii=False).encode()
    for label, blobs, number in (
        (f"store a bench request body ({len(bench_blob):,} B)", [bench_blob], 5_000),
        (f"store a raw response body ({len(response):,} B)", [response], 5_000),
        (f"store each bundled Who&When file ({average:,} B on average)", trajectories, 20),
        (f"store a 100-KB prompt ({len(long_prompt):,} B, over 64 KiB)", [long_prompt], 200),
    ):
        rows.append(
            (
                label,
                best_us(lambda blobs=blobs: [compress_blob(blob) for blob in blobs], number) / len(blobs),  # type: ignore[misc]
                best_us(lambda blobs=blobs: [blob_columns(blob) for blob in blobs], number) / len(blobs),  # type: ignore[misc]
            )
        )
    # Stamping a row: `datetime.isoformat` each time, against `utc_timestamp` (the text to the second once a
    # second). And the call cache key: the standard library's encoder, against orjson for ASCII names.
    rows.append(
        (
            "stamp a row with the time (4 a call)",
            best_us(
                lambda: datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"), 100_000
            ),
            best_us(utc_timestamp, 100_000),
        )
    )
    key_fields: dict[str, object] = {
        "backbone": "deepseek",
        "model": "deepseek-chat",
        "stage": "attribution",
        "realization": 0,
        "method": "all-at-once",
        "request": "0" * 64,
    }
    rows.append(
        (
            "the call cache key",
            best_us(
                lambda: hashlib.sha256(
                    json.dumps(key_fields, sort_keys=True, separators=(",", ":")).encode()
                ).hexdigest(),
                50_000,
            ),
            best_us(
                lambda: call_cache_key(
                    backbone="deepseek",
                    model="deepseek-chat",
                    request_sha256="0" * 64,
                    stage="attribution",
                    realization=0,
                    method_label="all-at-once",
                ),
                50_000,
            ),
        )
    )
    _add_loading_and_prompt_parts(rows, trajectories, response)
    sizes = [
        (len(zlib.compress(blob, 6)), len(zlib.compress(blob, 1)), len(blob))
        for blob in [bench_blob, *trajectories]
    ]
    print(f"{'part':<58} {'before us':>10} {'after us':>10} {'after/before':>13}")
    for name, before, after in rows:
        print(f"{name:<58} {before:>10.1f} {after:>10.1f} {after / before:>13.3f}")
    level6, level1, raw = (sum(column) for column in zip(*sizes, strict=True))
    print(
        f"compressed size of those blobs: level 6 {level6 / raw:.3f} of the bytes, level 1 {level1 / raw:.3f}"
    )


if __name__ == "__main__":
    main()
