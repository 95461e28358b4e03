"""Command-line options generated from pydantic configs, so every flow parameter is a flag.

Fields become `--name` (and `--name-with-dashes`); nested configs become `--parent.field`.
Only flags the user actually passes override the config defaults. A YAML (or JSON) file of the
same settings can stand in for the flags: `gym train run.yaml --max-steps 10` (see `file_argv`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic import BaseModel, ValidationError

from gym import secrets
from gym.errors import ConfigError

SEP = "."
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
USAGE_LINES = 12  # a longer usage (a flow's hundreds of flags) is shown as one line pointing to --help


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as `error: <message>` on the last line (status 2, as argparse),
    after the usage when it is short, else after one line saying where the options are listed.

    A long flag is taken only as spelled in full (argparse's allow_abbrev off): `--learning 0.5` is not
    `--learning_rate`, as a config file's `learning: 0.5` is not, and a new flag can't make an
    abbreviation someone relied on ambiguous (`--method` once failed against `--method_eval_dataset`).
    """

    source: Path | None = None  # a config file being read: its errors name it

    argv: Sequence[str] = ()  # the arguments being parsed

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if message.startswith(("the following arguments are required", "one of the arguments")):
            # A mistyped flag is the likelier cause (`--modle x` leaves --model missing): name it.
            unknown = [a.split("=")[0] for a in self.argv if a.startswith("--") and not self._known(a)]
            message = f"unrecognized arguments: {' '.join(unknown)}" if unknown else message
        message = self._hide_secrets(message) + self._suggestion(message)
        if self.source is not None:
            raise ConfigError(f"{self.source}: {message}")
        usage = self.format_usage()
        if usage.count("\n") > USAGE_LINES:
            usage = f"usage: {self.prog} [options]   (every option: {self.prog} --help)\n"
        self._print_message(usage, sys.stderr)
        self.exit(2, f"error: {message}\n")

    def _get_option_tuples(self, option_string: str) -> Any:
        """Abbreviations, except of a flag naming a secret: `--api_key sk-...` is not `--api_key_env`."""
        tuples = super()._get_option_tuples(option_string)
        return [t for t in tuples if not secrets.secret_name(str(t[1]).lstrip("-"))]

    def _hide_secrets(self, message: str) -> str:
        """`message` without the values given to secret-named flags (`--api_key sk-...`, `token=...`)."""
        for i, arg in enumerate(self.argv):
            name, eq, value = arg.lstrip("-").partition("=")
            if not secrets.secret_name(name):
                continue
            if not eq and arg.startswith("-") and i + 1 < len(self.argv):
                value = self.argv[i + 1]
            if value:
                message = message.replace(value, secrets.REDACTED)
        return secrets.scrub(message)

    def _known(self, arg: str) -> bool:
        """Whether `arg` (`--x`, `--x=v`) is one of this parser's flags or an abbreviation of one."""
        flag = arg.split("=")[0]
        return flag in self._option_string_actions or (
            self.allow_abbrev and any(f.startswith(flag) for f in self._option_string_actions)
        )

    def _suggestion(self, message: str) -> str:
        """`; did you mean --x?` for an unknown or ambiguous flag (`--epochs`, `--lr`, a typo), if any."""
        words = message.split()
        if message.startswith("unrecognized arguments:"):  # a flag, or a `name=value` override after a file
            flag = next((w for w in words[2:] if w.startswith("--") or ("=" in w and w[0] != "-")), None)
        elif message.startswith("ambiguous option:"):
            flag = words[2].split("=")[0]
        else:
            return ""
        names = [f for f in self._option_string_actions if f.startswith("--") and not f.startswith("--no-")]
        close = similar_flags(flag or "", names)
        return f"; did you mean {' or '.join(close)}?" if close else ""

    def parse_file(self, path: Path, settings: dict[str, Any]) -> argparse.Namespace:
        """The settings read from config file `path` (see `read_config_file`), parsed as flags."""
        self.source = path
        try:
            return self.parse_args(file_argv(path, settings, self._option_string_actions))
        finally:
            self.source = None


# Short names people type for settings that have long ones (LLaMA-Factory's and transformers' names).
SHORT_NAMES = {
    "lr": "learning_rate",
    "epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "bs": "per_device_train_batch_size",
    "steps": "max_steps",
    "model": "model_name_or_path",
    "rank": "lora_rank",
}


def similar_flags(flag: str, names: Sequence[str], n: int = 3) -> list[str]:
    """Up to `n` of the option strings `names` that `flag` (`--sft.lr`, `--epochs`, a typo) may mean:
    the long name of a known short one, else close spellings, then names ending in its last word."""
    name = flag.split("=")[0].removeprefix("--").replace("-", "_")
    if not name:
        return []
    section, _, last = name.rpartition(SEP)
    prefix = f"{section}{SEP}" if section else ""
    known = {f.removeprefix("--").replace("-", "_"): f for f in names}
    if last in SHORT_NAMES and prefix + SHORT_NAMES[last] in known:
        return [known[prefix + SHORT_NAMES[last]]]
    found = difflib.get_close_matches(name, list(known), n=n)
    found += [k for k in known if k.startswith(prefix) and k.rpartition(SEP)[2].endswith(f"_{last}")]
    out: list[str] = []
    for k in found:
        if k in known and known[k] not in out:
            out.append(known[k])
    return out[:n]


def whole_number(low: int, high: int | None, what: str) -> Callable[[str], int]:
    """An argparse type for a whole number in [low, high] (no upper bound: None); `what` says what it is
    in the error, e.g. "a port from 1 to 65535"."""

    def parse(value: str) -> int:
        number = int(value) if value.strip().isdigit() else low - 1
        if number < low or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"{what} (got {value!r})")
        return number

    return parse


def port(any_free: bool) -> Callable[[str], int]:
    """An argparse type for a TCP port: 1-65535, or 0 too (`any_free`: the system picks a free one)."""
    low = 0 if any_free else 1
    return whole_number(low, 65535, f"a port from {low} to 65535")


def error_words(error: Any) -> str:
    """What one of pydantic's errors says is wrong, in a validator's own words where it wrote them (no
    "Value error, "), "must not be empty" for a text field of at least one character and "must not be
    blank" for one whose pattern is one non-space (pydantic said "String should match pattern '\\S'")."""
    if error.get("type") == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == r"\S":
        return "must not be blank"
    if error.get("type") == "string_too_short" and error.get("ctx", {}).get("min_length") == 1:
        return "must not be empty"
    return str(error["msg"]).removeprefix("Value error, ")


def flag_error(exc: ValidationError, dashes: bool = True) -> ConfigError:
    """Settings built from flags that failed validation, as one line naming the flag and the value:
    `--shard-size: <what is wrong> (got '0')` (`dashes`: the command spells its flags with dashes)."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    message = error_words(first)
    given = first.get("input")
    shown = isinstance(given, str | int | float) and repr(given) not in message
    shown = shown and not (secrets.secret_name(field) or secrets.holds_secret(given))
    return ConfigError(
        f"--{field.replace('_', '-') if dashes else field}: {message}"
        + (f" (got {given!r})" if shown else "")
    )


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class Switch(argparse.Action):
    """A boolean flag: `--x` or `--x true` (True), `--x false` or `--no-x` (False)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        negated = [f"--no-{o[2:]}" for o in option_strings if o.startswith("--")]
        super().__init__([*option_strings, *negated], dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        flag = option_string or self.option_strings[0]
        if flag.startswith("--no-"):
            if values is not None:
                parser.error(f"argument {flag}: takes no value")
            setattr(namespace, self.dest, False)
        elif values is None or values.lower() in TRUE:
            setattr(namespace, self.dest, True)
        elif values.lower() in FALSE:
            setattr(namespace, self.dest, False)
        else:
            parser.error(f"argument {flag}: expected true or false (got {values!r})")


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
            kwargs["action"] = Switch
        elif get_origin(tp) is Literal:
            kwargs["choices"] = list(get_args(tp))
            kwargs["type"] = _literal(get_args(tp))
        elif get_origin(tp) is list:
            kwargs["nargs"] = "+"
            kwargs["metavar"] = "ITEM"
        elif tp in (int, float, str):
            kwargs["type"] = _optional(tp) if optional else tp
        elif tp is dict or get_origin(tp) is dict:
            kwargs["type"] = json_mapping
            kwargs["metavar"] = "JSON"
        action = group.add_argument(*flags, **kwargs)
        if tp is str and name.endswith("dataset"):  # every dataset setting takes a comma-separated mix
            comma_separated(action)


COMMA_SEPARATED = "comma_separated"


def comma_separated(action: argparse.Action) -> argparse.Action:
    """Mark option `action` as one text value that lists items with commas (`--dataset a,b`): a config
    file may give it as a list (`dataset: [a, b]`), as LLaMA-Factory's YAML files may."""
    setattr(action, COMMA_SEPARATED, True)
    return action


def _literal(values: tuple[Any, ...]) -> Any:
    """Parse one of a Literal's values from its text (`--train.quant.bits 4` is the int 4); other text is
    returned as given, for argparse's "invalid choice" message."""
    by_text = {str(v): v for v in values}

    def parse(text: str) -> Any:
        return by_text.get(text, text)

    parse.__name__ = "choice"
    return parse


def _optional(tp: type) -> Any:
    """Parse `tp`, or None from the words none/null (for fields that may be unset)."""

    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "null") else tp(text)

    parse.__name__ = tp.__name__  # argparse's message: "invalid float value: 'abc'"
    return parse


def json_mapping(text: str) -> dict[str, Any]:
    """A mapping given as JSON (a config file's mapping arrives as JSON): `{"min_lr_rate": 0.1}`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f'expected a JSON mapping such as {{"min_lr_rate": 0.1}} (got {text!r}: {exc.msg} at character '
            f"{exc.pos + 1})"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a mapping such as {{"min_lr_rate": 0.1}} (got {text!r})')
    return value


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


def split_config_file(argv: Sequence[str]) -> tuple[Path | None, list[str]]:
    """`run.yaml --flag ...` -> (the config file, the flags); the file can only come first."""
    args = list(argv)
    if args and not args[0].startswith("-") and args[0].lower().endswith(CONFIG_SUFFIXES):
        return Path(args[0]), args[1:]
    return None, args


def dotlist(argv: Sequence[str], known: Collection[str]) -> list[str]:
    """LLaMA-Factory's overrides after a config file (`run.yaml learning_rate=1e-5`) as flags: a bare
    `name=value` becomes `--name=value` when `--name` is one of the parser's options `known`."""
    out = []
    for arg in argv:
        name, eq, _ = arg.partition("=")
        out.append(f"--{arg}" if eq and not arg.startswith("-") and f"--{name}" in known else arg)
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's settings: a YAML (or JSON) mapping of flag names, without dashes, to values."""
    import yaml

    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        with path.open(encoding="utf-8") as stream:  # YAML's messages then name the file
            data = yaml.safe_load(stream)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid YAML or JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of settings (`learning_rate: 1.0e-4`), not a {type(data).__name__}"
        )
    return data


def file_argv(path: Path, settings: dict[str, Any], known: Collection[str]) -> list[str]:
    """A config file's settings as the flags they stand for, given the parser's option strings `known`.

    `learning_rate: 1.0e-4` is `--learning_rate=0.0001`; a mapping nests (`train: {lora: {r: 16}}` is
    `--train.lora.r=16`, as is the key `train.lora.r`); a list gives several values; true, false and
    null are `--flag`, `--flag=false` and `--flag=none`. An unknown key fails, naming the file and the
    closest known names. When `known` maps the option strings to their actions (as a parser's
    `_option_string_actions` does), a list for a setting that takes one value is joined with commas if
    that value is a comma-separated list (`comma_separated`), else it fails, as does a mapping for a
    setting that isn't one.
    """
    argv: list[str] = []

    def walk(mapping: dict[Any, Any], prefix: str) -> None:
        for key, value in mapping.items():
            name = f"{prefix}{key}"
            flag = f"--{name}"
            if flag in known:
                action = known.get(flag) if isinstance(known, Mapping) else None
                if isinstance(action, argparse.Action) and action.nargs is None:
                    value = _one_value(f"{path}: {name}", action, value)
                argv.extend(_as_flag(flag, value))
            elif isinstance(value, dict):
                walk(value, f"{name}{SEP}")
            else:
                flags = [k for k in known if k.startswith("--") and not k.startswith("--no-")]
                close = [f[2:] for f in similar_flags(flag, flags)]
                hint = f"; did you mean {' or '.join(close)}?" if close else " (`--help` lists the settings)"
                if name == "stage":  # LLaMA-Factory's; a flow script runs the stages it is made of
                    hint = ": this flow runs its own stages; leave it out (`gym train FILE` reads it)"
                raise ConfigError(f"{path}: unknown setting {name!r}{hint}")

    walk(settings, "")
    return argv


def _one_value(where: str, action: argparse.Action, value: Any) -> Any:
    """A config file's value for an option that takes one: a list joined with commas for a
    comma-separated option (`dataset: [a, b]` is `--dataset=a,b`); any other list, or a mapping for an
    option that isn't a JSON mapping, fails."""
    if isinstance(value, list) and getattr(action, COMMA_SEPARATED, False):
        return ",".join(str(v) for v in value)
    if isinstance(value, list) or (isinstance(value, dict) and action.type is not json_mapping):
        kind = "list" if isinstance(value, list) else "mapping"
        raise ConfigError(f"{where} takes one value, not a {kind} ({value!r})")
    return value


def _as_flag(flag: str, value: Any) -> list[str]:
    if value is True:
        return [flag]
    if value is False:
        return [f"{flag}=false"]
    if value is None:
        return [f"{flag}=none"]
    if isinstance(value, list):
        return [flag, *(str(v) for v in value)]
    if isinstance(value, dict):
        return [f"{flag}={json.dumps(value)}"]
    return [f"{flag}={value}"]
