"""Reward functions by name: built-ins, parameterised built-ins, reward models and any Python callable,
all called one way (TRL's): `reward(prompts=..., completions=..., answer=[...], metadata=[...]) -> floats`.

    from gym.rewards import load_rewards
    rewards, weights = load_rewards(["exact_match", "my_pkg.rewards:fn"], [1.0, 0.5])

Specs (what `--reward` takes):

    exact_match, numeric_match       the completion equals / numerically equals the ground-truth answer
    final_answer, answer_format      the answer after `Answer:`/`答案：`/`####` is right / the form is right
    regex:PATTERN                    1.0 when the stripped completion fully matches PATTERN
    length_penalty:MAX[,CACHE]       DAPO's soft overlong penalty over completion tokens (TRL's): 0 up to
                                     MAX-CACHE tokens, falling linearly to -1 at MAX (CACHE default MAX/4)
    reward_model:SOURCE              a sequence-classification model: registry name, hub id or directory
    pkg.module:function              any importable callable (also pkg.module.function)

A callable is either per completion, `fn(completion, answer=None, *, prompt, metadata, completion_ids)
-> float` taking only the arguments it names (like gym.rewards.match), or TRL-style batched,
`fn(prompts, completions, **kwargs) -> list[float]`, recognised by a parameter named `completions`
(so TRL's own reward functions, e.g. `trl.rewards:think_format_reward`, work as they are). Batched
functions get TRL's columns: conversational prompts and completions, `answer`, `metadata` (JSON text).
A per-completion function gets the completion as its first positional argument and the answer as its
second, if it has one (whatever its name; one named `prompt`, `metadata` or `completion_ids` gets that by
name instead); `answer`, `prompt`, `metadata` and `completion_ids` go by name to the parameters so named
(keyword-only or not), and all of them to a `**kwargs`. A function that cannot be called this way (a
required parameter left over, no parameter for the completion) is refused when it loads.
In multi-turn episodes every reward scores the last assistant turn: it is the completion (and its
tokens `completion_ids`) that both kinds get; batched functions also get the whole episode as
`conversation` (the prompt's messages, then every turn).
A reward may return None for a completion it does not apply to; it is then left out, as in TRL. The
built-ins that compare with the answer (`NEEDS_ANSWER`) return None for a record without one.
A user's function that raises fails the run with one line (a `RewardError` naming the reward, the
exception and the completion; the exception itself is its cause).
"""

from __future__ import annotations

import inspect
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, GymError
from gym.rewards import answer as answer_rewards
from gym.rewards import match
from gym.user_code import load_callable, split_spec

# Arguments a per-completion reward may name, besides the completion and the answer.
CONTEXT = ("prompt", "metadata", "completion_ids")
# What a per-completion reward is, for errors.
CONVENTION = (
    "a reward is fn(completion, answer=None, *, prompt, metadata, completion_ids) -> float, naming only "
    "the arguments it uses, or TRL's fn(prompts, completions, **kwargs) -> list[float]"
)
# Built-ins that compare a completion with the record's answer: None (not applicable) without one.
NEEDS_ANSWER = ("exact_match", "numeric_match", "final_answer")


class RewardError(GymError, RuntimeError):
    """A user's reward function raised: names the reward, the exception and the completion (its cause)."""


def completion_text(completion: Any) -> str:
    """The text of a completion given as a string or as TRL's conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def metadata_of(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return json.loads(value) if isinstance(value, str) and value else {}


class Reward:
    """A named reward function with TRL's batched calling convention."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        spec: str | None = None,
        needs_answer: bool = False,
        user: bool = False,
    ):
        self.name = self.__name__ = name  # TRL names the reward's metrics after __name__
        self.fn = fn
        self.batched = batched
        self.spec = spec or name
        self.needs_answer = needs_answer  # None for a record without an answer; refused on data with none
        self.user = user  # a user's function: what it raises is reported as a RewardError
        if not batched:
            self._positional, self._by_name = calling(fn, self.spec)

    def __repr__(self) -> str:
        return f"Reward({self.spec!r})"

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> list[float | None]:
        turns = columns.get("last_turn")
        if turns is not None:  # multi-turn episodes (gym/train/grpo/multiturn.py): score the last turn
            completions = [
                t if isinstance(c, str) else [{"role": "assistant", "content": t}]
                for c, t in zip(completions, turns, strict=True)
            ]
            if columns.get("last_turn_ids") is not None:
                columns = {**columns, "completion_ids": columns["last_turn_ids"]}
        if self.batched:
            what = f"a batch of {len(completions)} completions"
            returned = self._call(what, prompts=prompts, completions=completions, **columns)
            if not _sequence(returned):  # a forgotten `return`, or one number for the whole batch
                given = "None" if returned is None else f"{type(returned).__name__} {returned!r:.60}"
                raise ConfigError(
                    f"reward {self.spec}: returned {given} for {what}; a "
                    "batched reward returns one value per completion (a list, None where one doesn't apply)"
                )
            values = list(returned)
            if len(values) != len(completions):
                raise ConfigError(
                    f"reward {self.spec}: returned {len(values)} values for {len(completions)} completions "
                    "(one per completion, None where it doesn't apply)"
                )
            return [self._number(v, i) for i, v in enumerate(values)]
        n = len(completions)
        answers = columns.get("answer") or [None] * n
        metadata = columns.get("metadata") or [None] * n
        ids = columns.get("completion_ids") or [None] * n
        texts = [completion_text(c) for c in completions]
        out: list[float | None] = []
        for i in range(n):
            if self.needs_answer and answers[i] is None:
                out.append(None)  # nothing to compare with: not applicable, as TRL reads None
                continue
            passed = {"answer": answers[i], "prompt": prompts[i], "completion_ids": ids[i]}
            named = {k: metadata_of(metadata[i]) if k == "metadata" else passed[k] for k in self._by_name}
            args = (texts[i], answers[i])[: self._positional]
            out.append(self._number(self._call(f"completion {i}", *args, **named), i))
        return out

    def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """The function's value; what a user's function raises becomes a RewardError naming it and `what`."""
        if not self.user:
            return self.fn(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except GymError:
            raise
        except Exception as e:
            raise RewardError(f"reward {self.spec} raised {e!r:.300} on {what}") from e

    def _number(self, value: Any, i: int) -> float | None:
        """A reward as a float (None: it doesn't apply); anything else names the reward and the value."""
        if value is None:
            return None
        if isinstance(value, (int, float)) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
            number = float(value)  # an int, a bool, a 0-d numpy or torch number
            # NaN is TRL's "doesn't apply", as None is. An infinity is no score: PPO turned it into a huge
            # finite reward and its policy into NaNs; GRPO logged `reward: Infinity` and learned nothing.
            if not math.isinf(number):
                return number
        raise ConfigError(
            f"reward {self.spec}: returned {type(value).__name__} {value!r:.60} for completion {i}; a reward "
            "is a finite number per completion (or None where it doesn't apply)"
        )


def _sequence(value: Any) -> bool:
    """Whether a batched reward's result holds one value per completion: a list, tuple, 1-d array or
    tensor; not None, a number, a string or a mapping."""
    if value is None or isinstance(value, (str, bytes, dict)) or getattr(value, "ndim", 1) == 0:
        return False
    return isinstance(value, Iterable)


def calling(fn: Callable[..., Any], spec: str) -> tuple[int, tuple[str, ...]]:
    """How a per-completion reward `fn` is called: how many positional arguments (the completion, then
    the answer) and which of `answer` and CONTEXT by name. A ConfigError when `fn` cannot be called so."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none to read: the positional convention
        return 2, ()
    kind = inspect.Parameter
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
    var_positional = any(p.kind is kind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind is kind.VAR_KEYWORD for p in params)
    first = positional[0].name if positional else None  # the completion's, whatever its name
    names = {p.name for p in params if p.kind in (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)} - {first}
    second = positional[1] if len(positional) > 1 else None
    # The answer goes second unless the function names it, or names a context argument second.
    answer_second = "answer" not in names and (
        (second is not None and (second.name not in CONTEXT or second.kind is kind.POSITIONAL_ONLY))
        or (second is None and var_positional)
    )
    positional_count = 1 + answer_second
    by_name = tuple(
        k
        for k in ("answer", *CONTEXT)
        if (k in names or var_keyword) and not (k == "answer" and answer_second)
    )
    if not positional and not var_positional:
        raise ConfigError(f"reward {spec!r}: {signature} takes no completion; {CONVENTION}")
    try:
        signature.bind(*[None] * positional_count, **dict.fromkeys(by_name))
    except TypeError as e:  # it failed mid-run, at the first reward, with a TypeError traceback
        given = ", ".join(["the completion", "the answer"][:positional_count] + [f"{k}=" for k in by_name])
        raise ConfigError(
            f"reward {spec!r}: {signature} cannot be called per completion (given {given}: {e}); {CONVENTION}"
        ) from None
    return positional_count, by_name


def weighted_sum(scores: Sequence[Sequence[float | None]], weights: Sequence[float]) -> list[float]:
    """Per completion, the weighted sum of the rewards that apply (None skipped); NaN when none does."""
    out = []
    for column in zip(*scores, strict=True):
        given = [(w, s) for w, s in zip(weights, column, strict=True) if s is not None and not math.isnan(s)]
        out.append(sum(w * s for w, s in given) if given else math.nan)
    return out


def _length_penalty(arg: str) -> Reward:
    from trl.rewards import get_soft_overlong_punishment

    parts = [p.strip() for p in arg.split(",")]
    try:
        max_len = int(parts[0])
        cache = int(parts[1]) if len(parts) > 1 else max_len // 4
    except ValueError:
        raise ConfigError(
            f"length_penalty:{arg}: expected length_penalty:MAX or MAX,CACHE (integers)"
        ) from None
    if not 0 < cache <= max_len:
        raise ConfigError(f"length_penalty:{arg}: need 0 < CACHE <= MAX")
    return Reward("length_penalty", get_soft_overlong_punishment(max_len, cache), batched=True)


def _reward_model(arg: str) -> Reward:
    from gym.rewards.model import RewardModel

    return Reward("reward_model", RewardModel(arg), batched=True)


BUILTINS: dict[str, Callable[..., Any]] = {
    "exact_match": match.exact_match,
    "numeric_match": match.numeric_match,
    "final_answer": answer_rewards.final_answer,
    "answer_format": answer_rewards.answer_format,
}
FACTORIES: dict[str, Callable[[str], Reward]] = {
    "regex": lambda arg: Reward("regex", answer_rewards.regex_reward(arg)),
    "length_penalty": _length_penalty,
    "reward_model": _reward_model,
}


def _import(spec: str) -> Callable[..., Any]:
    module_name, attr = split_spec(spec)
    if not module_name or not attr:
        raise ConfigError(
            f"unknown reward {spec!r}: not a built-in ({', '.join([*BUILTINS, *FACTORIES])}) "
            "nor a dotted path to a function (pkg.module:function)"
        )
    return load_callable(spec, "reward")


def identity(specs: Sequence[str]) -> list[Any]:
    """What the rewards `specs` compute, beyond their names, for cache keys: a user's reward function's
    code as this process has it loaded (its compiled body, nested functions included) and the source
    file of its module (and of the module the spec names, where that differs): any edit to that file, a
    constant or helper the function reads there included, retrains the stage. What the function reads
    elsewhere (other modules, files, the environment) is not followed. A reward model folder's files.
    Built-ins are their name (gym's own code is in every key already)."""
    from gym.hashing import stamp

    out: list[Any] = []
    for spec in specs:
        spec = spec.strip()
        kind, sep, arg = spec.partition(":")
        if spec in BUILTINS or (sep and kind in FACTORIES and kind != "reward_model"):
            out.append(spec)
        elif kind == "reward_model":
            out.append({"spec": spec, "files": stamp(Path(arg).expanduser())})
        else:
            out.append(code_identity(spec))
    return out


def code_identity(spec: str) -> dict[str, Any]:
    """What the function `spec` (pkg.module:function, or pkg.module.function) computes, for cache keys:
    its code as this process has it loaded (its compiled body, nested functions included) and the source
    files of its module and of the module the spec names (see `identity`). A user's reward function, and
    a multi-turn environment (rl.environment) the same way."""
    import marshal

    from gym.hashing import hash_obj

    try:
        fn = _import(spec)
    except Exception:  # not importable (training says so)
        return {"spec": spec, "code": None}
    try:
        code = getattr(fn, "__code__", None)
        body = hash_obj(marshal.dumps(code).hex()) if code is not None else None
    except Exception:  # not marshalable
        body = None
    return {"spec": spec, "code": body, "sources": _module_sources(fn, spec)}


def _module_sources(fn: Callable[..., Any], spec: str) -> dict[str, str | None]:
    """Content hashes of the source files of `fn`'s module and of the module `spec` names, by module name
    (None for a module without a source file: a builtin, an extension, one made in memory)."""
    from gym.hashing import hash_file

    module_name = split_spec(spec)[0]
    names = dict.fromkeys([getattr(fn, "__module__", None), module_name])
    out: dict[str, str | None] = {}
    for name in filter(None, names):
        module = sys.modules.get(name)
        try:
            source = inspect.getsourcefile(module) if module is not None else None
            out[name] = hash_file(Path(source)) if source else None
        except (TypeError, OSError):
            out[name] = None
    return out


def load_reward(spec: str) -> Reward:
    """The reward a spec names (see the module docstring). Reward models load their weights on first use."""
    spec = spec.strip()
    if spec in BUILTINS:
        return Reward(spec, BUILTINS[spec], needs_answer=spec in NEEDS_ANSWER)
    kind, sep, arg = spec.partition(":")
    if sep and kind in FACTORIES:
        if not arg:
            raise ConfigError(f"reward {spec!r}: {kind} needs an argument ({kind}:...)")
        reward = FACTORIES[kind](arg)
        reward.spec = spec
        return reward
    fn = _import(spec)
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none to read
        signature = None
    batched = signature is not None and "completions" in signature.parameters
    name = re.sub(r"\W", "_", getattr(fn, "__name__", spec.rsplit(":", 1)[-1]))
    return Reward(name, fn, batched=batched, spec=spec, user=True)  # per completion: checked by `calling`


def load_rewards(
    specs: Sequence[str], weights: Sequence[float] | None = None
) -> tuple[list[Reward], list[float]]:
    """The rewards of `specs` with unique names, and their weights (1.0 each unless given)."""
    if not specs:
        raise ConfigError("no reward function given; pass at least one (e.g. --reward exact_match)")
    if weights is not None and len(weights) != len(specs):
        raise ConfigError(
            f"{len(weights)} reward weights for {len(specs)} rewards; give one weight per reward"
        )
    rewards, seen = [], set()
    for spec in specs:
        reward = load_reward(spec)
        base, i = reward.name, 2
        while reward.name in seen:
            reward.name = reward.__name__ = f"{base}_{i}"
            i += 1
        seen.add(reward.name)
        rewards.append(reward)
    return rewards, [float(w) for w in weights] if weights is not None else [1.0] * len(specs)
