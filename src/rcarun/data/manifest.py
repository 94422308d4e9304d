"""Manifests: which trajectories a sweep runs, pinned by SHA-256, and the LongRCA-Mini sampling protocol.

A screening result means something only if everyone ran the same trajectories, byte for byte. rcarun's own
format and the official LongRCA-Mini list are read; the protocol (LongRCA App. A) is reimplemented from its
description, so use the shipped official list to run the official Mini. Formats and protocol:
docs/reliability.md ("Manifests and the Mini sampling protocol").
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from rcarun.errors import DataError

from .loaders import natural_sort_key

__all__ = [
    "DEFAULT_MINI_SEED",
    "DEFAULT_MINI_SIZE",
    "LONGRCA_MINI",
    "Manifest",
    "ManifestRecord",
    "allocate_quotas",
    "dataset_sha256",
    "load_manifest",
    "longrca_mini_manifest_path",
    "sample_mini",
    "save_manifest",
]

LONGRCA_MINI = "longrca-mini"  # names the official list wherever a manifest path is accepted
DEFAULT_MINI_SIZE = 200
DEFAULT_MINI_SEED = 20260821  # the seed of the released LongRCA-Mini manifest (App. A)


@dataclass(frozen=True, slots=True)
class ManifestRecord:
    """One selected trajectory, with the SHA-256 of the record as released and, when given, its path and size."""

    qid: str
    source: str
    sha256: str
    path: str | None = None
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A fixed list of trajectories; ``seed``, ``size`` and ``dataset_sha256`` are None for a list rcarun did
    not draw; ``origin`` is ``"rcarun"`` or ``"longrca"``."""

    records: tuple[ManifestRecord, ...]
    seed: int | None = None
    size: int | None = None
    quotas: dict[str, int] = field(default_factory=dict)
    dataset_sha256: str | None = None
    origin: str = "rcarun"

    @property
    def qids(self) -> frozenset[str]:
        return frozenset(record.qid for record in self.records)

    def by_qid(self) -> dict[str, ManifestRecord]:
        return {record.qid: record for record in self.records}

    def to_json(self) -> dict[str, Any]:
        """rcarun's manifest format (docs/reliability.md)."""
        return {
            "seed": self.seed,
            "size": self.size,
            "quotas": dict(sorted(self.quotas.items())),
            "dataset_sha256": self.dataset_sha256,
            "records": [{"qid": r.qid, "source": r.source, "sha256": r.sha256} for r in self.records],
        }


def longrca_mini_manifest_path() -> Path:
    """The official LongRCA-Mini manifest shipped with rcarun (200 question_IDs with their SHA-256)."""
    return Path(str(resources.files("rcarun.data").joinpath("manifests/longrca_mini.json")))


def allocate_quotas(populations: Mapping[str, int], size: int) -> dict[str, int]:
    """Equal allocation capped at each population, with total-preserving rounding; `ValueError` when impossible."""
    if size < 0:
        raise ValueError(f"sample size must be >= 0, got {size}")
    if any(count < 0 for count in populations.values()):
        raise ValueError(f"populations must be >= 0, got {dict(populations)}")
    total = sum(populations.values())
    if size > total:
        raise ValueError(f"sample size {size} exceeds the dataset's {total} trajectories")
    shares: dict[str, float] = {}
    open_sources = sorted(populations)
    remaining = float(size)
    while open_sources:
        share = remaining / len(open_sources)
        capped = [source for source in open_sources if populations[source] <= share]
        if not capped:
            shares.update(dict.fromkeys(open_sources, share))
            break
        for source in capped:
            shares[source] = float(populations[source])
            remaining -= populations[source]
        open_sources = [source for source in open_sources if source not in capped]
    quotas = {source: int(shares[source]) for source in sorted(populations)}
    left = size - sum(quotas.values())
    # Largest fractional part first; ties to the source that sorts first.
    by_fraction = sorted(populations, key=lambda source: (-(shares[source] - quotas[source]), source))
    for source in by_fraction[:left]:
        quotas[source] += 1
    return quotas


def _source_seed(seed: int, source: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{source}".encode()).digest()[:8], "big")


def dataset_sha256(records: Iterable[tuple[str, str]]) -> str:
    """SHA-256 of ``"<qid>\\t<sha256>\\n"`` over every ``(qid, sha256)`` pair, sorted by qid."""
    digest = hashlib.sha256()
    for qid, sha in sorted(records):
        digest.update(f"{qid}\t{sha}\n".encode())
    return digest.hexdigest()


def sample_mini(
    records: Iterable[tuple[str, str, str]],
    *,
    size: int = DEFAULT_MINI_SIZE,
    seed: int = DEFAULT_MINI_SEED,
) -> Manifest:
    """Draw a Mini manifest from ``(qid, source, sha256)`` triples; `ValueError` for a repeated qid or size."""
    by_source: dict[str, list[tuple[str, str]]] = {}
    seen: set[str] = set()
    for qid, source, sha in records:
        if qid in seen:
            raise ValueError(f"qid {qid!r} appears twice")
        seen.add(qid)
        by_source.setdefault(source, []).append((qid, sha))
    quotas = allocate_quotas({source: len(members) for source, members in by_source.items()}, size)
    selected: list[ManifestRecord] = []
    for source in sorted(by_source):
        members = sorted(by_source[source], key=lambda member: natural_sort_key(member[0]))
        drawn = random.Random(_source_seed(seed, source)).sample(members, quotas[source])
        for qid, sha in sorted(drawn, key=lambda member: natural_sort_key(member[0])):
            selected.append(ManifestRecord(qid=qid, source=source, sha256=sha))
    everything = ((qid, sha) for members in by_source.values() for qid, sha in members)
    return Manifest(
        records=tuple(selected),
        seed=seed,
        size=size,
        quotas=quotas,
        dataset_sha256=dataset_sha256(everything),
    )


def save_manifest(manifest: Manifest, path: str | Path) -> None:
    """Write ``manifest`` in rcarun's format (UTF-8 JSON, 2-space indent, trailing newline)."""
    Path(path).write_text(json.dumps(manifest.to_json(), indent=2) + "\n", encoding="utf-8")


def load_manifest(path: str | Path) -> Manifest:
    """Read a manifest in rcarun's format or the official LongRCA one (``"longrca-mini"``: the shipped list).

    Raises:
        DataError: unreadable, not JSON, neither format, or a record without qid/sha256 (named by index).
    """
    if str(path) == LONGRCA_MINI:
        path = longrca_mini_manifest_path()
    where = str(path)
    try:
        raw = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise DataError(f"cannot read manifest: {exc.strerror or exc}", path=where) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"manifest is not UTF-8 JSON: {exc}", path=where) from None
    if not isinstance(raw, dict):
        raise DataError("manifest must be a JSON object", path=where)
    if isinstance(raw.get("records"), list):
        return _load_rcarun(raw, where)
    if isinstance(raw.get("files"), list):
        return _load_longrca(raw, where)
    raise DataError(
        "not a manifest: expected a 'records' list (rcarun) or a 'files' list (LongRCA)", path=where
    )


def _text_field(entry: Any, key: str, *, where: str, label: str) -> str:
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"expected a non-empty string, got {value!r}", path=where, record=label, field=key)
    return value.strip()


def _load_rcarun(raw: dict[str, Any], where: str) -> Manifest:
    records = []
    for index, entry in enumerate(raw["records"]):
        label = f"records[{index}]"
        records.append(
            ManifestRecord(
                qid=_text_field(entry, "qid", where=where, label=label),
                source=_text_field(entry, "source", where=where, label=label),
                sha256=_text_field(entry, "sha256", where=where, label=label).lower(),
            )
        )
    quotas = raw.get("quotas") or {}
    if not isinstance(quotas, dict) or not all(isinstance(v, int) for v in quotas.values()):
        raise DataError("expected an object of source → count", path=where, field="quotas")
    seed, size = raw.get("seed"), raw.get("size")
    return Manifest(
        records=tuple(records),
        seed=seed if isinstance(seed, int) else None,
        size=size if isinstance(size, int) else None,
        quotas={str(k): int(v) for k, v in quotas.items()},
        dataset_sha256=raw.get("dataset_sha256") if isinstance(raw.get("dataset_sha256"), str) else None,
        origin="rcarun",
    )


def _load_longrca(raw: dict[str, Any], where: str) -> Manifest:
    records = []
    for index, entry in enumerate(raw["files"]):
        label = f"files[{index}]"
        qid = _text_field(entry, "question_ID", where=where, label=label)
        sha = _text_field(entry, "sha256", where=where, label=label).lower()
        release_path = entry.get("path") if isinstance(entry.get("path"), str) else None
        parent = PurePosixPath(release_path).parent.name if release_path else ""
        source = parent or qid.split("__", 1)[0]
        size_bytes = entry.get("bytes")
        records.append(
            ManifestRecord(
                qid=qid,
                source=source,
                sha256=sha,
                path=release_path,
                size_bytes=size_bytes if isinstance(size_bytes, int) else None,
            )
        )
    quotas: dict[str, int] = {}
    for record in records:
        quotas[record.source] = quotas.get(record.source, 0) + 1
    return Manifest(records=tuple(records), size=len(records), quotas=quotas, origin="longrca")
