"""Which of the LongRCA paper's two evaluation protocols (``main``, ``ablation``) a report follows.

The paper scores and tests its main comparisons and its component ablations by different rules; every rule that
differs is decided here, once, from the run's methods and the user's flags, so the report can say what it did
and why. The rules and how ``auto`` chooses: docs/analysis.md ("Protocols"). Methods are matched by the
registry name behind each label in the run's stored config; a label the config does not know is its own name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcarun.errors import ConfigError

from .scoring import ABSTENTION_RULES, METRICS, AbstentionRule

__all__ = [
    "ABLATION_RESAMPLES",
    "AGGREGATES",
    "FULL_RCTA",
    "HOLM_FAMILIES",
    "MAIN_RESAMPLES",
    "PAPER_BASELINES",
    "PROTOCOLS",
    "MethodKind",
    "Protocol",
    "method_kinds",
    "resolve_protocol",
    "scoring_rule",
    "uses_manifest",
]

PROTOCOLS = ("auto", "main", "ablation")
AGGREGATES = ("auto", "macro", "pooled")
HOLM_FAMILIES = ("paper", "metric", "all")
"""``paper``: the protocol's own family (App. B or App. H); ``metric``: every comparison of a metric in the
report together; ``all``: every comparison of the report together."""

# The five baselines of the paper's main comparison (Sec. 5.1), by registry name.
PAPER_BASELINES = ("all-at-once", "step-by-step", "binary-search", "echo", "falat")
FULL_RCTA = "rcta"
# Providers whose backbones the user serves: App. B's Holm family holds the API backbones only.
SELF_HOSTED_PROVIDERS = ("vllm", "local")
# RCTA's preset of App. H's inference settings, which every cell of the component study shares; each prediction's
# output records the preset it ran at.
ABLATION_PRESET = "ablation"
MAIN_RESAMPLES = 20_000  # App. B, "Paired Step Acc comparisons" (Table 12)
ABLATION_RESAMPLES = 10_000  # App. H, "Ablation statistical protocol"
_MAIN_METRICS = tuple(m.name for m in METRICS if "main" in m.paired)
_ABLATION_METRICS = tuple(m.name for m in METRICS if "ablation" in m.paired)


@dataclass(frozen=True, slots=True, order=True)
class MethodKind:
    """What a method label of a run is.

    Attributes:
        label: the label the run's rows carry.
        name: the registry name behind it (``all-at-once``, ``rcta``, ``rcta/no-a2``, ...).
        ablation: the RCTA component condition (``no-a1`` .. ``no-a4``), None for any other method.
    """

    label: str
    name: str
    ablation: str | None = None

    @property
    def is_rcta(self) -> bool:
        """Full RCTA or one of its component conditions."""
        return self.name == FULL_RCTA or self.name.startswith(f"{FULL_RCTA}/")

    @property
    def full_rcta(self) -> bool:
        """RCTA with all components."""
        return self.is_rcta and self.ablation is None

    @property
    def component_condition(self) -> bool:
        """RCTA without one component (``rcta/no-aX``)."""
        return self.is_rcta and self.ablation is not None

    @property
    def paper_baseline(self) -> bool:
        """One of the paper's five baselines (Sec. 5.1)."""
        return self.name in PAPER_BASELINES


def _config(config_json: str) -> dict[str, Any]:
    try:
        config = json.loads(config_json)
    except (json.JSONDecodeError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def _kind(label: str, name: str, options: Mapping[str, Any]) -> MethodKind:
    ablation: str | None = None
    if name.startswith(f"{FULL_RCTA}/"):
        ablation = name.removeprefix(f"{FULL_RCTA}/")
    elif name == FULL_RCTA and isinstance(options.get("ablation"), str):
        ablation = options["ablation"]
    return MethodKind(label=label, name=name, ablation=ablation)


def method_kinds(config_json: str, labels: Iterable[str]) -> dict[str, MethodKind]:
    """The kind of every label in ``labels``, read from a run's stored sweep config (docs/analysis.md).

    Args:
        config_json: ``runs.config_json`` (the sweep config as JSON); anything unreadable counts as empty.
        labels: the method labels the run's rows carry.
    """
    known: dict[str, MethodKind] = {}
    methods = _config(config_json).get("methods")
    for entry in methods if isinstance(methods, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        name: str = entry["name"]
        given = entry.get("label")
        label = given if isinstance(given, str) and given else name
        found = entry.get("options")
        options: Mapping[str, Any] = found if isinstance(found, dict) else {}
        known[label] = _kind(label, name, options)
    return {label: known.get(label) or _kind(label, label, {}) for label in labels}


def app_b_backbones(config_json: str, backbones: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """The backbones of App. B's Holm family by default, and why: the run's API backbones (Holm-20/40 cover the
    four API backbones; the self-hosted Qwen3.5-35B-A3B is left out), or every backbone when none or all of them
    are self-hosted (``provider`` ``vllm`` or ``local``)."""
    found = _config(config_json).get("backbones")
    table: Mapping[str, Any] = found if isinstance(found, dict) else {}

    def self_hosted(name: str) -> bool:
        entry = table.get(name)
        return isinstance(entry, dict) and entry.get("provider") in SELF_HOSTED_PROVIDERS

    hosted = [name for name in backbones if self_hosted(name)]
    api = tuple(name for name in backbones if not self_hosted(name))
    if not hosted:
        return tuple(backbones), "every backbone of the run (none is self-hosted)"
    if not api:
        return tuple(
            backbones
        ), "every backbone of the run (all are self-hosted; App. B's holds API backbones)"
    return api, (
        f"the run's API backbones, {', '.join(api)}; self-hosted {', '.join(hosted)} left out, as App. B leaves "
        "out Qwen3.5-35B-A3B (--holm-backbones to choose)"
    )


def uses_manifest(config_json: str) -> bool:
    """The run selected its trajectories by a manifest (``sweep.manifest``, e.g. LongRCA-Mini)."""
    sweep = _config(config_json).get("sweep")
    return isinstance(sweep, dict) and bool(sweep.get("manifest"))


def scoring_rule(abstentions: AbstentionRule, keep_handoff: bool) -> str:
    """The scoring rule in words, naming the protocol and paper sections it belongs to."""
    parts = [
        "an abstaining output is scored on the role and step it gives"
        if abstentions == "fields"
        else "abstentions count as errors for every target",
        "handoff suffixes kept in role matching"
        if keep_handoff
        else "handoff suffixes dropped in role matching",
        "invalid fields count as errors for their own target",
    ]
    if abstentions == "fields" and not keep_handoff:
        where = "main protocol, LongRCA Sec. 5.1 and App. L.1"
    elif abstentions == "error" and keep_handoff:
        where = "component-ablation protocol, LongRCA App. L.1 and App. H"
    else:
        where = "a mix of the paper's two protocols, chosen by flags"
    return f"{'; '.join(parts)} ({where})"


@dataclass(frozen=True, slots=True)
class Protocol:
    """A report's protocol with every choice resolved, and why.

    Attributes:
        name: ``"main"`` or ``"ablation"``.
        reason: how it was chosen (the flag, or what ``auto`` saw in the run).
        aggregate: the headline aggregate, ``"macro"`` or ``"pooled"``.
        aggregate_reason: why.
        resamples: bootstrap resamples of the paired intervals.
        resamples_reason: why.
        seed: bootstrap seed.
        keep_handoff: role matching keeps handoff suffixes.
        abstentions: the abstention rule.
        holm_family: ``"paper"``, ``"metric"`` or ``"all"`` (`HOLM_FAMILIES`).
        paired_metrics: the metrics the paired comparisons test.
    """

    name: str
    reason: str
    aggregate: str
    aggregate_reason: str
    resamples: int
    resamples_reason: str
    seed: int
    keep_handoff: bool
    abstentions: AbstentionRule
    holm_family: str
    paired_metrics: tuple[str, ...]

    @property
    def rule(self) -> str:
        """The scoring rule in words (`scoring_rule`)."""
        return scoring_rule(self.abstentions, self.keep_handoff)


def _choose(requested: str, kinds: Mapping[str, MethodKind]) -> tuple[str, str]:
    full = sorted(k.label for k in kinds.values() if k.full_rcta)
    conditions = sorted(k.label for k in kinds.values() if k.component_condition)
    others = sorted(k.label for k in kinds.values() if not k.is_rcta)
    if requested == "ablation":
        if not full or not conditions:
            lacking = "full RCTA" if not full else "an RCTA component condition (rcta/no-a*)"
            raise ConfigError(
                f"--protocol ablation compares RCTA's component conditions with full RCTA, but the run has no "
                f"{lacking} (methods: {', '.join(repr(label) for label in sorted(kinds)) or 'none'})"
            )
        return "ablation", "--protocol ablation"
    if requested == "main":
        return "main", "--protocol main"
    if full and conditions and not others:
        return "ablation", "auto: the run holds full RCTA and its component conditions only"
    if full and conditions:
        return (
            "main",
            "auto: the run holds methods besides RCTA's component study, which gets a table of its own",
        )
    return "main", "auto: the run holds no RCTA component study"


def resolve_protocol(
    kinds: Mapping[str, MethodKind],
    source_sizes: Mapping[str, int],
    *,
    manifest: bool,
    protocol: str = "auto",
    aggregate: str | None = None,
    resamples: int | None = None,
    seed: int,
    keep_handoff: bool | None = None,
    abstentions: str | None = None,
    holm_family: str | None = None,
    paired_metrics: tuple[str, ...] | None = None,
) -> Protocol:
    """Resolve every choice of a report: the flag where one was given, else the protocol's default.

    Args:
        kinds: the run's method labels and what they are (`method_kinds`).
        source_sizes: expected (labelled) trajectories per source.
        manifest: the run selected its trajectories by a manifest (`uses_manifest`).
        protocol: ``"auto"``, ``"main"`` or ``"ablation"``.
        aggregate, resamples, keep_handoff, abstentions, holm_family, paired_metrics: the flags; None takes the
            protocol's default (docs/analysis.md).
        seed: the bootstrap seed.

    Raises:
        ConfigError: an unknown protocol, aggregate, abstention rule or Holm family, a resample count below 1,
            or ``ablation`` asked of a run without full RCTA and a component condition.
    """
    if protocol not in PROTOCOLS:
        raise ConfigError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    name, reason = _choose(protocol, kinds)
    ablation = name == "ablation"
    if aggregate not in (None, *AGGREGATES):
        raise ConfigError(f"--aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if aggregate in ("macro", "pooled"):
        chosen, why = str(aggregate), f"--aggregate {aggregate}"
    elif ablation:
        chosen, why = "macro", "auto: the component study's source-macro, App. H"
    elif manifest or len(set(source_sizes.values())) <= 1:
        chosen, why = "macro", "auto: a manifest or equal source sizes, as LongRCA-Mini, Sec. 5.1 and App. A"
    else:
        chosen, why = "pooled", "auto: natural source proportions, as Full, Sec. 5.1"
    if resamples is not None:
        if resamples < 1:
            raise ConfigError(f"--resamples must be >= 1, got {resamples}")
        count, count_why = resamples, "--resamples"
    elif ablation:
        count, count_why = ABLATION_RESAMPLES, "the ablation protocol's, App. H"
    else:
        count, count_why = MAIN_RESAMPLES, "the main protocol's, App. B and Table 12"
    if abstentions is not None and abstentions not in ABSTENTION_RULES:
        raise ConfigError(f"--abstentions must be one of {', '.join(ABSTENTION_RULES)}, got {abstentions!r}")
    rule: AbstentionRule = "error" if ablation else "fields"
    if abstentions == "fields":
        rule = "fields"
    elif abstentions == "error":
        rule = "error"
    family = holm_family or "paper"
    if family not in HOLM_FAMILIES:
        raise ConfigError(f"--holm-family must be one of {', '.join(HOLM_FAMILIES)}, got {family!r}")
    return Protocol(
        name=name,
        reason=reason,
        aggregate=chosen,
        aggregate_reason=why,
        resamples=count,
        resamples_reason=count_why,
        seed=seed,
        keep_handoff=ablation if keep_handoff is None else keep_handoff,
        abstentions=rule,
        holm_family=family,
        paired_metrics=paired_metrics or (_ABLATION_METRICS if ablation else _MAIN_METRICS),
    )
