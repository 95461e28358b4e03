"""Command-line options generated from pydantic configs, so every flow parameter is a flag.

Fields become `--name` (and `--name-with-dashes`); nested configs become `--parent.field`.
Only flags the user actually passes override the config defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic import BaseModel

SEP = "."


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as `error: <message>` on the last line (status 2, as argparse)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def add_config_options(parser: argparse.ArgumentParser, model: type[BaseModel], prefix: str = "") -> None:
    """Add one option per (nested) field of `model` to `parser`; dests are dotted field paths."""
    group = parser.add_argument_group(prefix.rstrip(SEP) or model.__name__)
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        tp, optional = _unwrap_optional(field.annotation)
        if _is_model(tp):
            add_config_options(parser, tp, prefix=f"{path}{SEP}")
            continue
        flags = sorted({f"--{path}", f"--{path.replace('_', '-')}"})
        help_text = field.description or ""
        kwargs: dict[str, Any] = {"dest": path, "default": argparse.SUPPRESS, "help": help_text}
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif get_origin(tp) is Literal:
            kwargs["choices"] = [str(c) for c in get_args(tp)]
        elif get_origin(tp) is list:
            kwargs["nargs"] = "+"
            kwargs["metavar"] = "ITEM"
        elif tp in (int, float, str):
            kwargs["type"] = _optional(tp) if optional else tp
        elif tp is dict or get_origin(tp) is dict:
            kwargs["type"] = json.loads
            kwargs["metavar"] = "JSON"
        group.add_argument(*flags, **kwargs)


def _optional(tp: type) -> Any:
    """Parse `tp`, or None from the words none/null (for fields that may be unset)."""

    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "null") else tp(text)

    return parse


def overrides_from(namespace: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The options the user passed, as a nested dict ready for `model.model_validate`."""
    nested: dict[str, Any] = {}
    for dest, value in vars(namespace).items():
        if not _is_field_path(model, dest):
            continue
        node = nested
        *parents, leaf = dest.split(SEP)
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested


def _is_field_path(model: type[BaseModel], dest: str) -> bool:
    current: Any = model
    for part in dest.split(SEP):
        if not _is_model(current) or part not in current.model_fields:
            return False
        current, _ = _unwrap_optional(current.model_fields[part].annotation)
    return True


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `update` into a copy of `base`."""
    out = dict(base)
    for k, v in update.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
