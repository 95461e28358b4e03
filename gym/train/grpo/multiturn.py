"""Multi-turn GRPO rollouts: an environment callback answers each assistant turn until it ends the episode.

    def env(messages: list[dict], record: dict) -> str | None:   # pkg.module:function, rl.environment
        ...   # record: the prompt's dataset row (answer, metadata); return the next user message or None

Plugged into TRL's GRPOTrainer as its `rollout_func`. Each episode starts from the prompt rendered
with the model's chat template; after every sampled assistant turn (ending with the end-of-turn
token) the environment's reply is appended as a user turn, in the template's own rendering, up to
`rl.max_turns` assistant turns. The completion TRL trains on is the whole episode after the prompt,
with `env_mask` 0 on the environment's and the template's tokens: only the model's own tokens carry
loss, as in SFT's assistant masking. Every assistant turn samples up to `rl.max_completion_length`
tokens, so an episode (its turns and the environment's) is longer than that.

Rewards, per completion or batched (TRL's), score the last assistant turn, as if it were the whole
completion: its text (`last_turn`) is the completion they get, and its tokens (`last_turn_ids`) their
`completion_ids` (gym.rewards.base.Reward); batched rewards also receive the whole episode as
`conversation` (the prompt's messages, then every turn).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gym.errors import ConfigError


def _key(messages: list[dict[str, str]]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)


def episode_suffix(tokenizer: Any, conversation: list[dict[str, str]], reply: str) -> str:
    """The text the chat template adds after the last assistant turn's end-of-turn token when the
    user answers `reply` and the assistant's next turn is opened."""
    before = tokenizer.apply_chat_template(conversation, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*conversation, {"role": "user", "content": reply}], tokenize=False, add_generation_prompt=True
    )
    eos = tokenizer.eos_token
    cut = before.rfind(eos) + len(eos) if eos and eos in before else len(before.rstrip())
    if not after.startswith(before[:cut]):
        raise ConfigError("the chat template re-renders earlier turns differently once a turn is added")
    return str(after[cut:])


def multi_turn_rollout(
    env: Callable[..., str | None], max_turns: int, dataset: Any
) -> Callable[[list[Any], Any], dict[str, Any]]:
    records = {
        _key(row["prompt"]): {
            "answer": row.get("answer"),
            "metadata": json.loads(row.get("metadata") or "{}"),
        }
        for row in dataset
    }

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        import torch

        tok = trainer.processing_class
        eos = tok.eos_token_id
        convs = [list(p) for p in prompts]
        prompt_ids = [
            list(
                tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)[
                    "input_ids"
                ]
            )
            for p in convs
        ]
        completion_ids: list[list[int]] = [[] for _ in convs]
        env_mask: list[list[int]] = [[] for _ in convs]
        last_turn = [""] * len(convs)
        last_ids: list[list[int]] = [[] for _ in convs]
        active = list(range(len(convs)))
        model = trainer.accelerator.unwrap_model(trainer.model)
        for turn in range(max_turns):
            if not active:
                break
            contexts = [prompt_ids[i] + completion_ids[i] for i in active]
            batch = tok.pad({"input_ids": contexts}, padding_side="left", return_tensors="pt").to(
                model.device
            )
            with torch.no_grad():
                out = model.generate(**batch, generation_config=trainer.generation_config)
            still = []
            for row, i in zip(out[:, batch["input_ids"].shape[1] :].tolist(), active, strict=True):
                new = row[: row.index(eos) + 1] if eos in row else row
                completion_ids[i] += new
                env_mask[i] += [1] * len(new)
                last_turn[i], last_ids[i] = tok.decode(new, skip_special_tokens=True), new
                convs[i].append({"role": "assistant", "content": last_turn[i]})
                if turn + 1 == max_turns or eos not in new:
                    continue
                reply = env(convs[i][:], records.get(_key(prompts[i]), {}))
                if reply is None:
                    continue
                suffix = tok(episode_suffix(tok, convs[i], reply), add_special_tokens=False)["input_ids"]
                convs[i].append({"role": "user", "content": reply})
                completion_ids[i] += suffix
                env_mask[i] += [0] * len(suffix)
                still.append(i)
            active = still
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,
            "env_mask": env_mask,
            "last_turn": last_turn,
            "last_turn_ids": last_ids,
            "conversation": convs,
        }

    return rollout
