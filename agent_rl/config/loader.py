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

from agent_rl.config.checks import check_settings
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


def _interpolate(tree: dict, root: dict) -> dict:
    """Resolve `${a.b}` references (trainer.default_local_dir holds one); a reference may name a
    value that holds references itself (`${trainer.default_local_dir}/validation`)."""

    def resolve(text: str, seen: tuple = ()) -> str:
        def lookup(m: re.Match) -> str:
            path = m.group(1)
            if path in seen:
                raise ValueError(f"config: ${{{path}}} refers to itself ({' -> '.join(seen + (path,))})")
            node: Any = root
            for k in path.split("."):
                node = node[k]
            return resolve(str(node), seen + (path,))

        return _REFERENCE.sub(lookup, text)

    return {k: _interpolate(v, root) if isinstance(v, dict) else resolve(v) if isinstance(v, str) else v
            for k, v in tree.items()}


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
    tree = _interpolate(tree, tree)
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


SECRETS = ("retriever.api_key",)
"""Settings that hold a secret (tests/agent_rl/test_config.py checks that every field named
like a key, token or password is here)."""
REDACTED = "<redacted>"


def redacted(config: dict) -> dict:
    """A copy of the plain config `config` (`to_dict`) with every secret that is set replaced by
    REDACTED: the one form of a config that leaves the process, to a logger (W&B's run config)
    or a file (each checkpoint's config.yaml). The key went to both before."""
    import copy

    out = copy.deepcopy(config)
    for key in SECRETS:
        *sections, name = key.split(".")
        node: Any = out
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(name) is not None:
            node[name] = REDACTED
    return out
