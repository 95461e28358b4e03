"""Demo datasets gym writes itself: small, learnable instruction tasks in English and Chinese.

They let `python flows/sft_then_dpo.py` run with no download: gym-tiny learns them on a 2-core
CPU in about a minute of SFT, and exact match on the held-out split shows it (~0 before, ~0.8
after; numbers in scripts/check_demo_learnable.py). Every record is generated from a fixed seed,
so the same call always returns the same records, in every process.

Nine tasks on digit strings, each asked with two English and two Chinese wordings: copy (4
digits), reverse (3), sort (3), largest and smallest digit (4), count the digits (2-7), the
larger of two 2-digit numbers, a 2-digit plus a 1-digit number, and digits (1-9) as Chinese
numerals. Inputs have a fixed length per task: gym-tiny splits digits one per token, and with a
fixed length a two-layer model aligns answer and input by relative position, which it learns in
about a thousand steps; mixed lengths and letter tasks stayed near zero in that budget.

Splits are cut from one stream of distinct problem instances (task, input), so no instance
appears in two datasets: the eval splits share nothing with any training split. As a chat
turn, an alpaca record is `instruction + "\n" + input` (how demo_chat writes its human turns).

Online RL (PPO, GRPO, GSPO) gets an answer-format task built on the same problems: every question
ends with a request to reply as `Answer: <answer>` (English) or `答案：<answer>` (Chinese).
`demo_format_sft` (the problems of demo_sft) follows that request in a random half of its answers
and answers plainly in the other half, so a model fine-tuned on it does both: rewards differ within
a group of sampled completions from the first step (gym-tiny starts from random weights, and a
reward that is always 0 teaches nothing). `demo_prompts` (prompts of 512 of demo_sft's problems) and
`demo_prompts_eval` (those of demo_sft_eval: held out) carry the answer as ground truth and the
task and language as metadata; the reward functions `final_answer` and `answer_format`
(gym.rewards) check the answer and the form. Asking plainly is what SFT on demo_sft teaches; only
reinforcement with the reward teaches the form consistently.

    from gym.data.demo import DEMO_DATASETS, demo_records
Continued pretraining (method pt) gets raw text: `demo_text` and its held-out split `demo_text_eval`
are short documents, each about one person in English or Chinese ("Anna lives in Paris. Anna has a
red cat. ..." / "小明住在北京。小明喜欢吃饺子。..."): three or four sentences from four templates
per language, filled from small word lists, with the person's name repeated in each. gym-tiny learns
the templates within a few dozen steps (held-out loss from ~8.3, a uniform guess over its 4,096
tokens, to under 3); no held-out document appears in training.

    records = demo_records("demo_sft")   # [{"instruction": ..., "input": ..., "output": ...}, ...]
    demo_records("demo_text")[0]         # {"text": "..."}

Run: .venv/bin/python -m gym.data.demo   (prints sizes and a sample of each dataset)
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from gym.errors import ConfigError

SEED = 0

DEMO_DATASETS: dict[str, str] = {
    "demo_sft": "alpaca",
    "demo_sft_eval": "alpaca",
    "demo_dpo": "preference",
    "demo_dpo_eval": "preference",
    "demo_kto": "kto",
    "demo_chat": "sharegpt",
    "demo_kto_eval": "kto",
    "demo_format_sft": "alpaca",
    "demo_prompts": "prompt",
    "demo_prompts_eval": "prompt",
    "demo_text": "text",
    "demo_text_eval": "text",
}
# Datasets that reuse the problem instances of another (same problems, asked for the answer format).
SAME_PROBLEMS = {
    "demo_format_sft": "demo_sft",
    "demo_prompts": "demo_sft",
    "demo_prompts_eval": "demo_sft_eval",
}

# Problem instances per dataset (demo_chat: conversations, each of 2-3 instances).
SIZES: dict[str, int] = {
    "demo_sft_eval": 200,
    "demo_dpo_eval": 100,
    "demo_sft": 6000,
    "demo_dpo": 800,
    "demo_kto": 600,
    "demo_chat": 24,
    # Added last: each dataset takes its share of the one problem stream in this order, so a new entry
    # at the end leaves every earlier dataset's records unchanged.
    "demo_kto_eval": 100,
}
_CHAT_TURNS = (2, 3)
_SYSTEM = {"en": "You are a helpful assistant.", "zh": "你是一个乐于助人的助手。"}

# The answer format the online-RL demo asks for, and the request that ends its questions.
ANSWER_PREFIX = {"en": "Answer: ", "zh": "答案："}
FORMAT_REQUEST = {"en": ' Reply in the form "Answer: <answer>".', "zh": "请用“答案：<答案>”的格式回答。"}
# Share of demo_format_sft answers written in the requested form.
FORMAT_SHARE = 0.5

ZH_NUMERALS = dict(zip("123456789", "一二三四五六七八九", strict=True))


# ---- inputs ---------------------------------------------------------------------------------


def _digits(n: int, alphabet: str = string.digits) -> Callable[[random.Random], str]:
    return lambda rng: "".join(rng.choice(alphabet) for _ in range(n))


def _count_input(rng: random.Random) -> str:
    return "".join(rng.choice(string.digits) for _ in range(rng.randint(2, 7)))


def _pair_input(rng: random.Random) -> str:
    return f"{rng.randint(10, 99)},{rng.randint(10, 99)}"


def _add_input(rng: random.Random) -> str:
    return f"{rng.randint(10, 99)}+{rng.randint(0, 9)}"


# ---- answers --------------------------------------------------------------------------------


def _add(s: str) -> str:
    a, b = s.split("+")
    return str(int(a) + int(b))


def _larger(s: str) -> str:
    return max(s.split(","), key=int)


def _zh(s: str) -> str:
    return "".join(ZH_NUMERALS[c] for c in s)


# ---- plausible wrong answers: candidates; any equal to the right answer is dropped -------------


def _swap(s: str, rng: random.Random) -> str:
    i = rng.randrange(len(s) - 1)
    return s[:i] + s[i + 1] + s[i] + s[i + 2 :]


def _perturb(answer: str, rng: random.Random) -> str:
    """Change one digit or Chinese numeral of `answer` into another of its kind (never a no-op)."""
    classes = (string.digits, "一二三四五六七八九")
    spots = [(i, cls) for i, ch in enumerate(answer) for cls in classes if ch in cls]
    i, cls = rng.choice(spots)
    return answer[:i] + rng.choice(cls.replace(answer[i], "")) + answer[i + 1 :]


def _wrong_copy(s: str, rng: random.Random) -> list[str]:
    return [s[:-1], _swap(s, rng), _perturb(s, rng)]


def _wrong_reverse(s: str, rng: random.Random) -> list[str]:
    return [s, _swap(s[::-1], rng), _perturb(s[::-1], rng)]


def _wrong_sort(s: str, rng: random.Random) -> list[str]:
    up = "".join(sorted(s))
    return [up[::-1], s, _swap(up, rng)]


def _wrong_pick(s: str, rng: random.Random) -> list[str]:
    return [rng.choice(s), str(min(9, int(max(s)) + 1)), str(max(0, int(min(s)) - 1))]


def _wrong_count(s: str, rng: random.Random) -> list[str]:
    return [str(len(s) + 1), str(len(s) - 1)]


def _wrong_larger(s: str, rng: random.Random) -> list[str]:
    a, b = s.split(",")
    return [min(a, b, key=int), _perturb(_larger(s), rng)]


def _wrong_add(s: str, rng: random.Random) -> list[str]:
    a, b = (int(x) for x in s.split("+"))
    no_carry = (a // 10) * 10 + (a + b) % 10
    return [str(a + b + 1), str(a + b - 1), str(a + b + 10), str(no_carry)]


def _wrong_zh(s: str, rng: random.Random) -> list[str]:
    zh = _zh(s)
    return [zh[::-1], zh[:-1], _perturb(zh, rng)]


@dataclass(frozen=True)
class Task:
    """One kind of problem: how to draw an input, solve it, get it plausibly wrong, and ask for it."""

    name: str
    sample: Callable[[random.Random], str]
    solve: Callable[[str], str]
    wrong: Callable[[str, random.Random], list[str]]
    en: tuple[str, ...]
    zh: tuple[str, ...]

    def wrong_answer(self, s: str, rng: random.Random) -> str:
        right = self.solve(s)
        options = sorted({w for w in self.wrong(s, rng) if w and w != right})
        return rng.choice(options) if options else _perturb(right, rng)


TASKS: tuple[Task, ...] = (
    Task(
        "copy",
        _digits(4),
        lambda s: s,
        _wrong_copy,
        ("Repeat the digits exactly.", "Copy the following digits."),
        ("重复下面的数字。", "原样复制下面的数字。"),
    ),
    Task(
        "reverse",
        _digits(3),
        lambda s: s[::-1],
        _wrong_reverse,
        ("Reverse the digits.", "Write the digits in reverse order."),
        ("把下面的数字倒序。", "把这些数字倒过来写。"),
    ),
    Task(
        "sort",
        _digits(3),
        lambda s: "".join(sorted(s)),
        _wrong_sort,
        ("Sort the digits from smallest to largest.", "Put the digits in ascending order."),
        ("把下面的数字从小到大排序。", "将这些数字按从小到大排列。"),
    ),
    Task(
        "max",
        _digits(4),
        max,
        _wrong_pick,
        ("Which is the largest digit?", "Find the largest digit."),
        ("下面哪个数字最大？", "找出最大的数字。"),
    ),
    Task(
        "min",
        _digits(4),
        min,
        _wrong_pick,
        ("Which is the smallest digit?", "Find the smallest digit."),
        ("下面哪个数字最小？", "找出最小的数字。"),
    ),
    Task(
        "count",
        _count_input,
        lambda s: str(len(s)),
        _wrong_count,
        ("How many digits are there?", "Count the digits."),
        ("一共有几个数字？", "数一数有几个数字。"),
    ),
    Task(
        "larger",
        _pair_input,
        _larger,
        _wrong_larger,
        ("Which number is larger?", "Give the bigger number."),
        ("哪个数更大？", "写出较大的数。"),
    ),
    Task(
        "add",
        _add_input,
        _add,
        _wrong_add,
        ("Add the numbers.", "What is the sum?"),
        ("请计算下面的加法。", "求和。"),
    ),
    Task(
        "zh_digits",
        _digits(4, "123456789"),
        _zh,
        _wrong_zh,
        ("Write each digit as a Chinese numeral.", "Spell the digits in Chinese."),
        ("把每个数字写成汉字。", "用汉字写出这些数字。"),
    ),
)


@dataclass(frozen=True)
class Problem:
    task: Task
    input: str

    @property
    def output(self) -> str:
        return self.task.solve(self.input)


@cache
def _problems() -> dict[str, tuple[Problem, ...]]:
    """Distinct (task, input) instances, tasks in rotation, cut into the datasets' shares."""
    rng = random.Random(SEED)
    seen: set[tuple[str, str]] = set()
    need = {name: n * (max(_CHAT_TURNS) if name == "demo_chat" else 1) for name, n in SIZES.items()}
    out: dict[str, tuple[Problem, ...]] = {}
    for name, n in need.items():
        problems = []
        for i in range(n):
            task = TASKS[i % len(TASKS)]
            for _ in range(10_000):
                if (key := (task.name, task.sample(rng))) not in seen:
                    break
            else:  # the task's input space is (nearly) used up: SIZES ask for more than it holds
                raise ConfigError(
                    f"demo task {task.name!r} has too few distinct inputs for SIZES; lower them"
                )
            seen.add(key)
            problems.append(Problem(task, key[1]))
        rng.shuffle(problems)
        out[name] = tuple(problems)
    return out


def _ask(p: Problem, rng: random.Random, lang: str | None = None) -> tuple[str, str]:
    lang = lang or rng.choice(("en", "zh"))
    return rng.choice(p.task.en if lang == "en" else p.task.zh), p.input


def _alpaca(problems: tuple[Problem, ...], rng: random.Random) -> list[dict]:
    return [
        {"instruction": ins, "input": inp, "output": p.output}
        for p in problems
        for ins, inp in [_ask(p, rng)]
    ]


def _preference(problems: tuple[Problem, ...], rng: random.Random) -> list[dict]:
    out = []
    for p in problems:
        ins, inp = _ask(p, rng)
        out.append(
            {"instruction": ins, "input": inp, "chosen": p.output, "rejected": p.task.wrong_answer(inp, rng)}
        )
    return out


def _kto(problems: tuple[Problem, ...], rng: random.Random) -> list[dict]:
    out = []
    for i, p in enumerate(problems):
        ins, inp = _ask(p, rng)
        good = i % 2 == 0
        answer = p.output if good else p.task.wrong_answer(inp, rng)
        out.append({"instruction": ins, "input": inp, "output": answer, "label": good})
    return out


def _sharegpt(problems: tuple[Problem, ...], rng: random.Random) -> list[dict]:
    out, pos = [], 0
    for i in range(SIZES["demo_chat"]):
        lang = ("en", "zh")[i % 2]
        turns: list[dict] = [{"from": "system", "value": _SYSTEM[lang]}] if i % 3 else []
        for p in problems[pos : pos + rng.choice(_CHAT_TURNS)]:
            ins, inp = _ask(p, rng, lang)
            turns += [{"from": "human", "value": f"{ins}\n{inp}"}, {"from": "gpt", "value": p.output}]
            pos += 1
        out.append({"conversations": turns})
    return out


def _ask_format(p: Problem, rng: random.Random) -> tuple[str, str]:
    """(language, question asking for the answer format) of a problem."""
    lang = rng.choice(("en", "zh"))
    ins, inp = _ask(p, rng, lang)
    return lang, f"{ins}{FORMAT_REQUEST[lang]}\n{inp}"


def _format_sft(problems: tuple[Problem, ...], rng: random.Random) -> list[dict]:
    out = []
    for p in problems:
        lang, question = _ask_format(p, rng)
        ins, inp = question.split("\n", 1)
        formatted = rng.random() < FORMAT_SHARE
        out.append({"instruction": ins, "input": inp, "output": ANSWER_PREFIX[lang] * formatted + p.output})
    return out


def _prompts(problems: tuple[Problem, ...], rng: random.Random) -> list[dict]:
    out = []
    for p in problems:
        lang, question = _ask_format(p, rng)
        out.append({"prompt": question, "answer": p.output, "metadata": {"task": p.task.name, "lang": lang}})
    return out


# ---- raw text (pretraining, method pt) ----------------------------------------------------------

# Documents per dataset, drawn in this order from one stream of distinct documents.
TEXT_SIZES = {"demo_text": 2000, "demo_text_eval": 200}
_WORDS = {
    "en": {
        "name": ("Anna", "Ben", "Clara", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack"),
        "city": ("Paris", "London", "Tokyo", "Cairo", "Lima", "Oslo", "Rome", "Seoul"),
        "color": ("red", "blue", "green", "yellow", "black", "white"),
        "animal": ("cat", "dog", "bird", "horse", "fish", "rabbit"),
        "food": ("apples", "bread", "rice", "noodles", "cheese", "soup"),
        "job": ("teacher", "doctor", "farmer", "pilot", "cook", "painter"),
    },
    "zh": {
        "name": ("小明", "小红", "小刚", "小丽", "王芳", "李雷", "韩梅", "张伟", "刘洋", "陈静"),
        "city": ("北京", "上海", "广州", "深圳", "成都", "杭州", "西安", "南京"),
        "color": ("红色", "蓝色", "绿色", "黄色", "黑色", "白色"),
        "animal": ("猫", "狗", "鸟", "马", "鱼", "兔子"),
        "food": ("苹果", "面包", "米饭", "面条", "饺子", "包子"),
        "job": ("老师", "医生", "农民", "飞行员", "厨师", "画家"),
    },
}
_SENTENCES = {
    "en": (
        "{name} lives in {city}.",
        "{name} has a {color} {animal}.",
        "{name} likes to eat {food}.",
        "{name} works as a {job}.",
    ),
    "zh": (
        "{name}住在{city}。",
        "{name}有一只{color}的{animal}。",
        "{name}喜欢吃{food}。",
        "{name}是一名{job}。",
    ),
}


def _document(rng: random.Random) -> str:
    """Three or four sentences about one person, in English or Chinese."""
    lang = rng.choice(("en", "zh"))
    words = {slot: rng.choice(options) for slot, options in _WORDS[lang].items()}
    sentences = rng.sample(_SENTENCES[lang], rng.choice((3, 4)))
    return (" " if lang == "en" else "").join(s.format(**words) for s in sentences)


@cache
def _documents() -> dict[str, tuple[str, ...]]:
    """Distinct documents, cut into the text datasets' shares (no document in two of them)."""
    rng = random.Random(f"{SEED}:text")
    seen: set[str] = set()
    out: dict[str, tuple[str, ...]] = {}
    for name, n in TEXT_SIZES.items():
        docs: list[str] = []
        while len(docs) < n:
            doc = _document(rng)
            if doc not in seen:
                seen.add(doc)
                docs.append(doc)
        out[name] = tuple(docs)
    return out


_BUILDERS = {"alpaca": _alpaca, "preference": _preference, "kto": _kto, "sharegpt": _sharegpt}
_OWN_BUILDERS = {"demo_format_sft": _format_sft, "demo_prompts": _prompts, "demo_prompts_eval": _prompts}
# demo_prompts asks the first PROMPTS problems of demo_sft: one epoch of GRPO with 8 prompts a step
# (batch 64, group size 8) is 64 steps, about a minute on a 2-core CPU.
PROMPTS = 512


def demo_records(name: str) -> list[dict]:
    """The records of demo dataset `name` (a key of DEMO_DATASETS), freshly built each call."""
    if name not in DEMO_DATASETS:
        raise ConfigError(f"unknown demo dataset {name!r}; available: {', '.join(DEMO_DATASETS)}")
    # A per-dataset rng: the wording of one dataset does not depend on the sizes of the others.
    rng = random.Random(f"{SEED}:{name}")
    if name in TEXT_SIZES:
        return [{"text": doc} for doc in _documents()[name]]
    if name in _OWN_BUILDERS:
        problems = _problems()[SAME_PROBLEMS[name]]
        return _OWN_BUILDERS[name](problems[:PROMPTS] if name == "demo_prompts" else problems, rng)
    return _BUILDERS[DEMO_DATASETS[name]](_problems()[name], rng)


if __name__ == "__main__":
    import json

    for name, fmt in DEMO_DATASETS.items():
        records = demo_records(name)
        print(f"{name} ({fmt}, {len(records)} records)")
        for r in records[:3]:
            print("   ", json.dumps(r, ensure_ascii=False))
