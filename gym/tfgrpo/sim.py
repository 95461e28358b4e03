"""A seeded simulated environment for Training-Free GRPO: proof that the pipeline learns, offline.

No capable model can run here, so the policy and the optimizer are simulated LLM clients (they
speak the same protocol and read the same prompts as real ones):

- Puzzles come in families (a topic each) with a hidden rule. The policy solves a puzzle with
  probability 0.25, or 0.85 when an experience in its system prompt names the puzzle's topic and
  the family's rule; when it fails it often applies a plausible wrong rule (the trap: another
  family's rule, giving the same wrong answer), and an experience recommending that trap makes it
  worse (0.05).
- The optimizer summarizes attempts faithfully, but extracts noisy rules: mostly the rule of the
  best attempt, sometimes a paraphrase of it (a duplicate), sometimes a vague platitude; it
  sometimes wraps its JSON in prose and trailing commas, and now and then writes junk (repaired
  on the retry). Consolidation keeps one rule per topic and approach against the library, merges
  duplicates it finds in the library, and updates a topic's rule when a better one is proposed.

Every answer is a function of the request (messages, seed), so completion order never matters.
`simulate()` trains on the training puzzles and measures held-out Mean@k before and after each
epoch, plus two ablations that must learn less: G=1 (no group to compare) and no ground truth
(majority-vote rewards, fooled by the trap).

    gym tfgrpo simulate --json
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gym.errors import ConfigError, GymWarning
from gym.tfgrpo.clients import Completion, LLMClient, Messages, Usage
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question, derive_seed
from gym.tfgrpo.engine import RunResult, train
from gym.tfgrpo.runtime import Runtime

TOPICS = ["clocks", "coins", "grids", "dice", "calendars", "mirrors", "ciphers", "ladders"]
METHODS = ["modular", "greedy", "parity", "inverse", "cyclic", "binary", "symmetric", "telescoping"]
VAGUE = "When unsure, double-check the answer before replying."
_ABOUT = re.compile(r"(?:about|mentions) (\w+), (?:always )?(use the \w+ method)", re.IGNORECASE)


def rule(topic: int) -> str:
    return f"use the {METHODS[topic]} method"


def trap(topic: int) -> str:
    return f"use the {METHODS[(topic + 1) % len(METHODS)]} method"


def _rng(*parts: object) -> random.Random:
    return random.Random(derive_seed(*parts))


def _usage(messages: Messages, texts: list[str]) -> Usage:
    return Usage(
        prompt_tokens=sum(len(m["content"].split()) for m in messages),
        completion_tokens=sum(len(t.split()) for t in texts),
    )


class SimEnv(BaseModel):
    """Puzzles: `families` topics, `train_per_family` + `eval_per_family` puzzles each."""

    families: int = 8
    train_per_family: int = 3
    eval_per_family: int = 4
    seed: int = 0

    def questions(self) -> tuple[list[Question], list[Question]]:
        train_q: list[Question] = []
        eval_q: list[Question] = []
        per = self.train_per_family + self.eval_per_family
        for topic in range(self.families):
            for j in range(per):
                number = 100 + _rng(self.seed, "answer", topic, j).randrange(800)
                text = f"Puzzle {topic * per + j} about {TOPICS[topic]}: what is the value?"
                q = Question(
                    id=f"{topic}-{j}", prompt=[{"role": "user", "content": text}], answer=str(number)
                )
                (train_q if j < self.train_per_family else eval_q).append(q)
        order = _rng(self.seed, "order").sample(train_q, len(train_q))
        return order, eval_q


class SimPolicy:
    identity = "sim:policy"
    max_n = 64

    def __init__(self, env: SimEnv) -> None:
        train_q, eval_q = env.questions()
        self.answers = {q.text: int(q.answer or 0) for q in [*train_q, *eval_q]}

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        question = messages[-1]["content"]
        topic = TOPICS.index(re.search(r"about (\w+)", question).group(1))  # type: ignore[union-attr]
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        lines = [line for line in system.splitlines() if TOPICS[topic] in line]
        knows = any(rule(topic) in line for line in lines)
        misled = not knows and any(trap(topic) in line for line in lines)
        p = 0.85 if knows else 0.05 if misled else 0.25
        answer = self.answers[question]
        texts = []
        for i in range(n):
            rng = _rng("policy", messages, seed, i)
            if rng.random() < p:
                texts.append(f"Approach: {rule(topic)}. Answer: {answer}")
            elif misled or rng.random() < 0.4:
                texts.append(f"Approach: {trap(topic)}. Answer: {answer + 1}")
            else:
                texts.append(f"Approach: guessing. Answer: {answer + rng.randrange(2, 40)}")
        return Completion(texts=texts, usage=_usage(messages, texts))


class SimOptimizer:
    identity = "sim:optimizer"
    max_n = 1

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        system, user = messages[0]["content"], messages[1]["content"]
        rng = _rng("optimizer", messages, seed)
        if len(messages) > 2:  # the repair turn: answer properly this time
            text = self._extract(messages[1]["content"], rng, noisy=False)
        elif system.startswith("You review"):
            text = self._summarize(user)
        elif system.startswith("You distil"):
            text = self._extract(user, rng, noisy=True)
        else:
            text = self._consolidate(user, rng)
        return Completion(texts=[text] * n, usage=_usage(messages, [text] * n))

    @staticmethod
    def _summarize(user: str) -> str:
        approach = re.search(r"Approach: (.*?)\. Answer", user)
        reward = re.search(r"Outcome: reward (\S+?)[;\n]", user + "\n")
        used = approach.group(1) if approach else "no clear approach"
        return f"The attempt chose to {used}; it earned reward {reward.group(1) if reward else '?'}."

    def _extract(self, user: str, rng: random.Random, noisy: bool) -> str:
        if "Consolidate" in user:
            return self._consolidate(user, rng)
        topic = re.search(r"about (\w+)", user).group(1)  # type: ignore[union-attr]
        attempts = re.findall(r"Attempt \d+ \(reward (\S+)\):\nThe attempt chose to (.*?); it", user)
        best_reward, best = max(((float(r), a) for r, a in attempts), key=lambda x: x[0], default=(0.0, ""))
        if not best.startswith("use the"):
            ops: list[dict[str, Any]] = []
        else:
            roll = rng.random()
            if roll < 0.3:
                ops = [{"operation": "add", "text": f"When the task is about {topic}, {best}."}]
            elif roll < 0.5:
                ops = [{"operation": "add", "text": f"When a puzzle mentions {topic}, always {best}."}]
            elif roll < 0.7:
                ops = [{"operation": "add", "text": VAGUE}]
            else:
                ops = []
            for alias, line in _listing(user):
                found = _ABOUT.search(line)
                if found and found.group(1) == topic and found.group(2) != best and best_reward > 0:
                    ops = [
                        {
                            "operation": "update",
                            "id": alias,
                            "text": f"When the task is about {topic}, {best}.",
                        }
                    ]
        if noisy and rng.random() < 0.1:
            return "I think the library is fine as it is, mostly."
        body = json.dumps(ops, indent=1)
        if noisy and rng.random() < 0.3:
            return f"Here are my suggestions:\n```json\n{body[:-1].rstrip()},\n]\n```\nThese should help."
        return body

    @staticmethod
    def _consolidate(user: str, rng: random.Random) -> str:
        library = _listing(user.split("Operations proposed")[0])
        keys: dict[tuple[str, str], list[str]] = {}
        for alias, text in library:
            found = _ABOUT.search(text)
            keys.setdefault((found.group(1), found.group(2)) if found else ("vague", text), []).append(alias)
        ops: list[dict[str, Any]] = []
        for (topic, approach), aliases in keys.items():
            if len(aliases) > 1 and topic != "vague":
                ops.append(
                    {
                        "operation": "merge",
                        "ids": aliases,
                        "text": f"When the task is about {topic}, {approach}.",
                    }
                )
        updated: set[str] = set()
        texts = {text for _, text in library}
        for line in re.findall(r"Group \d+: (.*)", user):
            for op in json.loads(line):
                text = op.get("text", "")
                found = _ABOUT.search(text)
                key = (found.group(1), found.group(2)) if found else ("vague", text)
                if op["operation"] == "update" and op["id"] not in updated:
                    updated.add(op["id"])
                    ops.append(op)
                elif op["operation"] == "add" and text not in texts:
                    if key[0] == "vague" and rng.random() < 0.5:
                        continue
                    texts.add(text)  # duplicates in meaning slip through; a later step merges them
                    ops.append(op)
        return json.dumps(ops)


def _listing(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^\[(G\d+)\] (.*)$", text, re.MULTILINE)


class SimReport(BaseModel):
    mean_at_k: list[float]
    pass_at_k: list[float]
    k: int
    ablations: dict[str, float]
    library_size: int
    library: list[str]
    llm_calls: int
    merges: int
    degraded_steps: int
    within_caps: bool
    seconds: float


def run_sim(
    settings: TfGrpoSettings, env: SimEnv, run_dir: Path, cache_dir: Path | None = None
) -> tuple[RunResult, Runtime]:
    train_q, eval_q = env.questions()
    clients: dict[str, LLMClient] = {"policy": SimPolicy(env), "optimizer": SimOptimizer()}
    rt = Runtime(
        settings, model=None, run_dir=run_dir, clients=clients, cache_dir=cache_dir or run_dir / "calls"
    )
    return train(rt, train_q, eval_q), rt


def default_settings(seed: int = 0) -> TfGrpoSettings:
    return TfGrpoSettings(
        group_size=5, epochs=3, batch_size=8, reward="numeric", max_items=12, eval_samples=4, seed=seed
    )


def simulate(seed: int = 0, root: Path | None = None) -> SimReport:
    """The main run and both ablations; Mean@k of the held-out puzzles, their run folders under `root`
    (default: a temporary folder, removed afterwards)."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix="gym-tfgrpo-sim-") as tmp:
            return simulate(seed, Path(tmp))
    root = Path(root).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--run-dir {root}: not a folder; give a folder (made if missing) or leave it out")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--run-dir {root}: can't make the folder ({exc.strerror or exc})") from None
    start = time.perf_counter()
    env = SimEnv(seed=seed)
    settings = default_settings(seed)
    main, _ = run_sim(settings, env, root / "main")
    with warnings.catch_warnings():  # the ablation that learns nothing by design: no warning that it does
        warnings.filterwarnings("ignore", "TF-GRPO: no group of the", GymWarning)
        g1, _ = run_sim(settings.model_copy(update={"group_size": 1}), env, root / "g1")
    no_gt, _ = run_sim(settings.model_copy(update={"reward": "majority"}), env, root / "no_ground_truth")
    from gym.tfgrpo.library import Library
    from gym.tfgrpo.step import load_manifest

    library = Library.load(main.library_file)
    manifests = [load_manifest(Path(main.run_dir), i) for i in range(main.steps)]
    merges = sum(op.op == "merge" for m in manifests if m for op in m.applied)
    return SimReport(
        mean_at_k=main.mean_at_k,
        pass_at_k=main.pass_at_k,
        k=settings.eval_samples,
        ablations={"g1": g1.mean_at_k[-1], "no_ground_truth": no_gt.mean_at_k[-1]},
        library_size=main.library_size,
        library=library.texts,
        llm_calls=main.llm_calls + g1.llm_calls + no_gt.llm_calls,
        merges=merges,
        degraded_steps=main.degraded_steps,
        within_caps=len(library.items) <= library.max_items
        and all(len(t.split()) <= library.max_words for t in library.texts),
        seconds=round(time.perf_counter() - start, 3),
    )
