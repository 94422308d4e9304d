"""Manifests: which trajectories a sweep runs, pinned by SHA-256, and the LongRCA-Mini sampling protocol.

A screening result means something only if everyone ran the same trajectories, byte for byte. A manifest names
them (qid, source, SHA-256 of the record) so a sweep can run exactly that subset and `rcarun data check
--manifest` can prove a user's copy is the released one.

Two formats are read by `load_manifest`:

- rcarun's own, written by `sample_mini` / `save_manifest`: ``{"seed", "size", "quotas": {source: count},
  "dataset_sha256", "records": [{"qid", "source", "sha256"}, ...]}``;
- the official LongRCA-Mini list (``mini_manifest.json`` of the dataset release): ``{"repository",
  "revision", "subset", "split", "files": [{"path", "question_ID", "sha256", "bytes"}, ...]}``; the source is
  the directory above the file in ``path`` (``data/mini/<source>/<question_ID>.json``), else the part of the
  question_ID before ``__``. A copy ships with rcarun (`longrca_mini_manifest_path`).

The sampling protocol (LongRCA App. A), implemented by `allocate_quotas` and `sample_mini`:

- Equal allocation: every source gets ``size / k``; a source whose population is smaller is capped at its
  population and the unused slots are shared evenly among the others, repeatedly, until no share exceeds a
  population (water-filling over real numbers). Deterministic rounding preserves the total: every share is
  floored, and the slots left go one each to the largest fractional parts, ties to the source that sorts
  first by name. With LongRCA's populations (128/42/685/108/177) this reproduces every quota row of the
  paper's Table 5, e.g. 225 → 46/42/46/46/45 and 600 → 128/42/161/108/161.
- Simple random sampling without replacement within each source: the source's qids in natural order, drawn
  with `random.Random(s).sample` where the seed ``s`` is the first 8 bytes of SHA-256(``"<seed>/<source>"``).
  Each source has its own stream, so a source's selection depends only on its own qids, its quota and the
  seed — never on predictions, labels or the other sources' contents.
- Hashes: each selected record's SHA-256 (of the file's bytes, or of the JSONL line), and ``dataset_sha256``
  = SHA-256 of the lines ``"<qid>\\t<sha256>\\n"`` of every record in the dataset, sorted by qid.

This reimplements the protocol from its description; the authors' sampler is not public, so the same seed
does not reproduce the official list. Use the official list (`longrca_mini_manifest_path`) to run the
official Mini.
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
    """One selected trajectory.

    Attributes:
        qid: the trajectory id (LongRCA ``question_ID``).
        source: the source it belongs to.
        sha256: hex SHA-256 of the record as released (file bytes, or the JSONL line).
        path: the file's path in the release, when the manifest gives it.
        size_bytes: the file's size in bytes, when the manifest gives it.
    """

    qid: str
    source: str
    sha256: str
    path: str | None = None
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A fixed list of trajectories.

    Attributes:
        records: the selection, in source then natural qid order for manifests rcarun draws.
        seed / size: the draw's seed and requested size (None for a list rcarun did not draw).
        quotas: source → number of records selected.
        dataset_sha256: hash of the whole dataset the draw came from (None when unknown).
        origin: ``"rcarun"`` or ``"longrca"`` (the official list's format).
    """

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
        """rcarun's manifest format (see the module docstring)."""
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
    """Equal allocation capped at each population, with total-preserving rounding (module docstring).

    Raises:
        ValueError: ``size`` is negative or exceeds the total population, or a population is negative.
    """
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
    """Draw a Mini manifest from ``(qid, source, sha256)`` triples by the protocol of the module docstring.

    Raises:
        ValueError: a qid repeats, or the size cannot be met.
    """
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
