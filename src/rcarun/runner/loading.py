"""Sweep configs read from TOML files, and slices of them.

Backbones are defined inline (``[backbones.NAME]``) or taken by name from a shared file (``backbones_file`` +
``use``); relative paths are resolved against the config file's directory. Every problem is one `ConfigError`
line naming the file and the key, found before any run exists.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rcarun.data import LONGRCA_MINI
from rcarun.errors import ConfigError
from rcarun.methods import create_method
from rcarun.runner.config import BackboneConfig, FieldProblem, MethodConfig, SweepConfig

__all__ = ["load_backbones_file", "load_sweep_config", "narrow_sweep"]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _explain(path: Path, exc: ValidationError, table: str = "") -> ConfigError:
    problems = []
    for error in exc.errors():
        loc = ((table,) if table else ()) + tuple(error["loc"])
        message = error["msg"]
        found = error.get("ctx", {}).get("error")
        if isinstance(found, FieldProblem):
            loc, message = loc + found.where, str(found)
        problems.append(f"{'.'.join(str(part) for part in loc) or '(top)'}: {message}")
    return ConfigError(f"{path}: {'; '.join(problems)}")


def load_backbones_file(path: Path) -> dict[str, BackboneConfig]:
    """Every ``[NAME]`` table of a backbones file, validated."""
    raw = _read_toml(path)
    backbones: dict[str, BackboneConfig] = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {name!r} must be a table")
        try:
            backbones[name] = BackboneConfig.model_validate(table)
        except ValidationError as exc:
            raise _explain(path, exc, table=name) from None
    return backbones


def load_sweep_config(path: Path) -> SweepConfig:
    """Parse a sweep TOML, pull the named backbones from ``backbones_file`` and resolve relative paths."""
    raw = _read_toml(path)
    try:
        config = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        raise _explain(path, exc) from None
    for index, method in enumerate(config.methods):
        try:  # an unknown name or a bad option is a config error, found before any run exists
            create_method(method.name, label=method.resolved_label, options=method.options)
        except ConfigError as exc:
            raise ConfigError(f"{path}: methods[{index}]: {exc}") from None
    base = path.parent
    backbones = dict(config.backbones)
    if config.backbones_file:
        shared = load_backbones_file((base / config.backbones_file).resolve())
        wanted = config.use or tuple(shared)
        missing = [name for name in wanted if name not in shared]
        if missing:
            raise ConfigError(f"{path}: use names backbones not in {config.backbones_file}: {missing}")
        for name in wanted:
            if name in backbones:
                raise ConfigError(f"{path}: backbone {name!r} defined inline and in {config.backbones_file}")
            backbones[name] = shared[name]
    elif config.use:
        raise ConfigError(f"{path}: 'use' needs a backbones_file")
    if not backbones:
        raise ConfigError(f"{path}: no backbones (define [backbones.NAME] or backbones_file + use)")
    sweep_update = {"dataset": str((base / config.sweep.dataset).resolve())}
    if config.sweep.manifest is not None and config.sweep.manifest != LONGRCA_MINI:
        sweep_update["manifest"] = str((base / config.sweep.manifest).resolve())
    return config.model_copy(
        update={"backbones": backbones, "sweep": config.sweep.model_copy(update=sweep_update)}
    )


def narrow_sweep(
    config: SweepConfig, *, backbones: Sequence[str] = (), methods: Sequence[str] = ()
) -> SweepConfig:
    """``config`` restricted to the named backbones and methods (by label, or by name for every label of it), for
    a slice of a sweep; an empty selection keeps all.

    A slice by one side only also drops what it leaves with nothing to do on the other (chat methods only: no
    local backbones, and the other way round), which `rcarun.runner.wiring.check_method_backbones` would
    refuse. A slice by both is taken as given.

    Raises:
        ConfigError: a name the config does not define (the known ones are listed).
    """
    updates: dict[str, Any] = {}
    if backbones:
        unknown = [name for name in backbones if name not in config.backbones]
        if unknown:
            raise ConfigError(
                f"--backbone {', '.join(unknown)}: not in the sweep (backbones: {', '.join(config.backbones)})"
            )
        updates["backbones"] = {
            name: config.backbones[name] for name in config.backbones if name in backbones
        }
    if methods:
        known = {method.resolved_label for method in config.methods} | {
            method.name for method in config.methods
        }
        unknown = [name for name in methods if name not in known]
        if unknown:
            labels = ", ".join(method.resolved_label for method in config.methods)
            raise ConfigError(f"--method {', '.join(unknown)}: not in the sweep (methods: {labels})")
        updates["methods"] = tuple(
            method for method in config.methods if method.resolved_label in methods or method.name in methods
        )
    if bool(backbones) != bool(methods):
        kept_methods: tuple[MethodConfig, ...] = updates.get("methods", config.methods)
        kept_backbones: dict[str, BackboneConfig] = updates.get("backbones", config.backbones)
        if methods:
            kinds = {_reads_model(method) for method in kept_methods}
            updates["backbones"] = {
                name: backbone for name, backbone in kept_backbones.items() if backbone.is_local in kinds
            }
        else:
            kinds = {backbone.is_local for backbone in kept_backbones.values()}
            updates["methods"] = tuple(method for method in kept_methods if _reads_model(method) in kinds)
    return config.model_copy(update=updates) if updates else config


def _reads_model(method: MethodConfig) -> bool:
    """Whether the method reads a model's internals (runs on local backbones), as its class declares."""
    return bool(create_method(method.name, label=method.resolved_label, options=method.options).reads_model)
