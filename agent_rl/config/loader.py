"""YAML and dotted overrides into the typed configs (`load_config`), and the one form of a
config that leaves the process (`to_dict` then `redacted`: secrets replaced)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from agent_rl.config.checks import ConfigError, check_settings
from data_prep.io import load_yaml

T = TypeVar("T")

# ----------------------------------------------------------------------------- loading
def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated type, with a clear error naming the key."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return _from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(args[0], value, where)
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",")] if value else []
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_coerce(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{where}: expected a boolean, got {value!r}")
    if tp in (int, float, str):
        try:
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return tp(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    return value


def _from_dict(cls: type[T], data: dict, where: str = "") -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(
            f"unknown config key(s) {sorted(f'{where}.{k}'.lstrip('.') for k in unknown)}; "
            f"valid keys here: {sorted(names)}"
        )
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}".lstrip(".")) for k, v in data.items()}
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.lstrip("+").split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {dotted!r}: {k!r} is not a section")
    node[keys[-1]] = value


_REFERENCE = re.compile(r"\$\{([^}]+)\}")
MAX_INTERPOLATED = 65536
"""Characters a value may grow to by interpolation: references that double at each level
(`x2=${x1}${x1}`) would otherwise grow without bound (2**30 characters at 30 levels)."""


def _interpolate(tree: dict) -> dict:
    """Resolve `${a.b}` references (trainer.default_local_dir holds one) in every text value
    of `tree`. A reference may name a value that holds references itself
    (`${trainer.default_local_dir}/validation`): each value is resolved once and reused, and
    text a reference brings in is not read again (re-expanding every use took exponential
    time: 21 nested references 5.6 s). A reference to no setting, to a section, to itself, or
    one that grows a value past MAX_INTERPOLATED characters is a ConfigError naming it; so is a
    reference to a secret (SECRETS): its copy would be a setting `redacted` does not know (a
    run directory named after the key). Lists are not interpolated."""
    done: dict[str, str] = {}
    active: list[str] = []

    def lookup(path: str, where: str) -> str:
        if path in SECRETS:
            raise ConfigError(f"{where}: ${{{path}}} would copy a secret (config.SECRETS) into a setting that "
                              f"leaves the process unredacted (logs, checkpoints, directory names); write it out")
        node: Any = tree
        for k in path.split("."):
            if not isinstance(node, dict) or k not in node:
                raise ConfigError(f"{where}: ${{{path}}} names no setting")
            node = node[k]
        if isinstance(node, dict):
            raise ConfigError(f"{where}: ${{{path}}} names a section, not a setting")
        return resolved(path, node) if isinstance(node, str) else str(node)

    def resolved(path: str, text: str) -> str:
        if path in done:
            return done[path]
        if path in active:
            raise ConfigError(f"config: ${{{path}}} refers to itself ({' -> '.join(active[active.index(path):] + [path])})")
        active.append(path)
        out = _REFERENCE.sub(lambda m: lookup(m.group(1), path), text)
        active.pop()
        if len(out) > MAX_INTERPOLATED and out != text:
            raise ConfigError(f"{path}: its references expand to more than {MAX_INTERPOLATED} characters")
        done[path] = out
        return out

    def walk(node: dict, prefix: str) -> dict:
        return {k: walk(v, f"{prefix}{k}.") if isinstance(v, dict) else resolved(f"{prefix}{k}", v)
                if isinstance(v, str) else v for k, v in node.items()}

    return walk(tree, "")


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build `cls` from defaults, then the YAML file, then `key.sub=value` overrides.

    Values of overrides are parsed as YAML scalars/lists (`lr=1e-6`, `url=[a,b]`).
    Unknown keys raise with the list of valid keys, so typos never pass silently.
    """
    tree: dict = dataclasses.asdict(cls())
    if path is not None:
        p = Path(path)
        # UTF-8 (BOM dropped, CRLF as LF); bad bytes or YAML: a ValueError naming file:line
        loaded = load_yaml(p) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{p}: top level must be a mapping")
        _deep_update(tree, loaded, str(p))
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key, yaml.safe_load(raw) if raw != "" else "")
    tree = _interpolate(tree)
    cfg = _from_dict(cls, tree)
    check_settings(cfg)
    return cfg


def _deep_update(base: dict, new: dict, where: str) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v, where)
        else:
            base[k] = v


def to_dict(cfg: Any) -> dict:
    """Plain dict of a config (for logging and checkpoints, which pass it through `redacted`)."""
    return dataclasses.asdict(cfg)


SECRETS = ("retriever.api_key", "retriever.proxy")  # a proxy URL may carry its user:password
"""Settings that hold a secret (tests/agent_rl/test_config.py checks that every field named
like a key, token or password is here). `${...}` may not copy one (`load_config` refuses), and
`redacted` hides a secret's value wherever else it was written."""
REDACTED = "<redacted>"


def redacted(config: dict) -> dict:
    """A copy of the plain config `config` (`to_dict`) with every secret that is set replaced by
    REDACTED: the one form of a config that leaves the process, to a logger (W&B's run config)
    or a file (each checkpoint's config.yaml). The key went to both before. A secret's value
    written into another setting too (by hand: interpolation from a secret is refused) is
    replaced there, inside the text that holds it."""
    import copy

    out = copy.deepcopy(config)
    values = []
    for key in SECRETS:
        *sections, name = key.split(".")
        node: Any = out
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(name) is not None:
            values.append(str(node[name]))
            node[name] = REDACTED
    return _masked(out, [v for v in values if v])


def _masked(node: Any, values: list[str]) -> Any:
    """`node` with every text holding one of `values` rewritten with REDACTED in its place."""
    if isinstance(node, dict):
        return {k: _masked(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v, values) for v in node]
    if isinstance(node, str):
        for value in values:
            node = node.replace(value, REDACTED)
    return node
