"""The papers' GRPOTrainer: `training_free=True` is Training-Free GRPO from Python; `training_free=False`
is gym's online GRPO method (weights trained through TRL: gym/train/grpo/online_trainer.py).

    from gym.train.grpo import GRPOTrainer
    from gym.train.grpo.experience_manager import ExperienceManager

    exp_manager = ExperienceManager(library_path="./experience_lib", max_size=100)
    trainer = GRPOTrainer(model=model, tokenizer=tokenizer, args=training_args,
                          finetuning_args=finetuning_args, experience_manager=exp_manager,
                          training_free=True, train_dataset="demo_sft")
    trainer.train()                                    # no parameter updates
    exp_manager.save("./experience_lib/final.json")

`model` may be a transformers model (with `tokenizer`), a registry name or checkpoint directory, a
model name at `endpoint=` (an OpenAI-compatible API), or any gym LLM client (APIModelAdapter).
`args` and `finetuning_args` are read for what applies (num_train_epochs, max_steps (TF-GRPO steps,
instead of the epochs), seed, output_dir, per_device_train_batch_size; group_size / grpo_group_size /
num_generations; dataset / eval_dataset, as LLaMA-Factory's data arguments name them); any
TfGrpoSettings field can be passed by keyword. With no training data named anywhere (the papers'
snippet names none), it learns from gym's demo questions, scored on their held-out split, as
`gym train --method tf_grpo` does without --dataset, and prints a note saying so. Training runs
gym.tfgrpo.engine (resumable, cost-accounted); the library ends up in the experience manager, and with
`args.output_dir` the model is saved there with its experiences.json (what serving injects, with the
run's retrieval_top_k). A library already at the experience manager's `library_path` is the starting
point, unless this same run wrote it (then the run resumes); `refresh_cache=True` asks every LLM call
again instead of reading gym's call cache (a model changed behind the same endpoint and name).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gym import workspace
from gym.errors import ConfigError
from gym.hashing import hash_obj
from gym.tfgrpo.clients import LLMClient, LoadedClient
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question, load_questions
from gym.tfgrpo.engine import RunResult, export_library, train
from gym.tfgrpo.injection import EXPERIENCE_FILE, written_by
from gym.tfgrpo.library import Library
from gym.tfgrpo.runtime import Runtime, with_start
from gym.train.grpo.experience_manager import ExperienceManager

GROUP_SIZE_NAMES = ("group_size", "grpo_group_size", "num_generations")
NO_DATASET_NOTE = (
    "note: GRPOTrainer: no train_dataset given: learning from gym's demo questions ({train}) and scoring "
    "held-out Mean@k on {held_out}, as `gym train --method tf_grpo` does without --dataset; pass "
    "train_dataset= (a dataset name or path, or records) to learn from your own"
)


def _read(source: Any, *names: str) -> Any:
    for name in names:
        value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
        if value is not None:
            return value
    return None


def default_datasets(args: Any, finetuning_args: Any) -> tuple[Any, Any]:
    """(train, held-out) data that `args` / `finetuning_args` name (`dataset`, `eval_dataset`), else
    the ones `gym train --method tf_grpo` runs without --dataset (its flow config's defaults), with a
    note on stderr: the papers' snippet passes no dataset, and should run as written."""
    named = _read(finetuning_args, "dataset") or _read(args, "dataset")
    if named is not None:
        return named, _read(finetuning_args, "eval_dataset") or _read(args, "eval_dataset")
    from gym.pipeline import TfGrpoFlowConfig

    defaults = TfGrpoFlowConfig()
    train, held_out = defaults.dataset, defaults.held_out_questions()
    print(NO_DATASET_NOTE.format(train=train, held_out=held_out), file=sys.stderr)
    return train, held_out


def questions_of(
    dataset: Any, limit: int | None, setting: str = "max_train_questions"
) -> tuple[list[Question], str]:
    """Questions from a dataset name/path, a datasets.Dataset, or records (question/answer,
    prompt/answer, instruction/output or messages): the first `limit` (the value of `setting`)."""
    if dataset is None:
        raise ConfigError("GRPOTrainer needs train_dataset (a dataset name or path, or records)")
    if isinstance(dataset, (str, Path)):
        return load_questions(dataset, limit, setting)
    questions = [_question(i, record) for i, record in enumerate(dataset)]
    if limit is not None and len(questions) > limit:
        print(
            f"note: GRPOTrainer uses the first {limit} of the {len(questions)} records given "
            f"({setting}={limit}: raise it to use more)",
            file=sys.stderr,
        )
        questions = questions[:limit]
    return questions, hash_obj([q.model_dump(mode="json") for q in questions])


def _question(i: int, record: Any) -> Question:
    if isinstance(record, Question):
        return record
    if "messages" in record:
        messages = list(record["messages"])
        return Question(id=str(i), prompt=messages[:-1], answer=messages[-1]["content"])
    text = _read(record, "question", "prompt", "instruction", "problem")
    if not isinstance(text, str):
        raise ConfigError(
            f"train_dataset record {i}: expected question/answer (or messages), got {sorted(record)}"
        )
    answer = _read(record, "answer", "output", "solution")
    return Question(
        id=str(i), prompt=[{"role": "user", "content": text}], answer=None if answer is None else str(answer)
    )


def _adapter_sampling(settings: TfGrpoSettings, clients: dict[str, Any]) -> TfGrpoSettings:
    """An APIModelAdapter given as a role's model samples as it was made to (its temperature and
    max_tokens), where the role's settings don't say otherwise."""
    from gym.train.grpo.api_model_adapter import APIModelAdapter

    update = {}
    for role, client in clients.items():
        if isinstance(client, APIModelAdapter):
            own = getattr(settings, role)
            fields = {f: getattr(client, f) for f in ("temperature", "max_tokens") if getattr(own, f) is None}
            update[role] = own.model_copy(update=fields)
    return settings.model_copy(update=update)


class GRPOTrainer:
    """The papers' trainer: `training_free=True` (the default) learns an experience library with
    Training-Free GRPO, leaving the weights as they are; `training_free=False` trains the weights with
    gym's online GRPO (TRL). `train()` runs it; `save_model(output_dir)` ships the model with its
    experiences.json. The module's docstring lists what `model`, `args`, `finetuning_args` and the
    datasets may be."""

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        args: Any = None,
        finetuning_args: Any = None,
        experience_manager: ExperienceManager | None = None,
        training_free: bool = True,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        optimizer_model: Any = None,
        template: str | None = None,
        **settings: Any,
    ) -> None:
        if model is None:
            raise ConfigError(
                "GRPOTrainer needs model= (a transformers model, a registry name or an API client)"
            )
        self.args, self.model, self.tokenizer, self.template = args, model, tokenizer, template
        self.training_free, self.finetuning_args = training_free, finetuning_args
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.result: RunResult | None = None
        if not training_free:  # online GRPO: only its own options apply
            self.reward_funcs, self.rl = settings.pop("reward_funcs", None), settings.pop("rl", None)
            if settings or optimizer_model is not None:
                unknown = sorted([*settings, *(["optimizer_model"] if optimizer_model is not None else [])])
                raise ConfigError(
                    f"GRPOTrainer(training_free=False) trains weights with online GRPO: {unknown} apply only "
                    "to training_free=True (online GRPO takes reward_funcs= and rl=)"
                )
            return
        self.refresh = bool(settings.pop("refresh_cache", False))  # ask every call again (Runtime.refresh)
        self.experience_manager = (
            experience_manager if experience_manager is not None else ExperienceManager()
        )
        library = self.experience_manager.library
        base: dict[str, Any] = {"max_items": library.max_items, "max_words": library.max_words}
        epochs, seed = _read(args, "num_train_epochs"), _read(args, "seed")
        batch, group = _read(args, "per_device_train_batch_size"), _read(finetuning_args, *GROUP_SIZE_NAMES)
        for key, value in (("epochs", epochs), ("seed", seed), ("batch_size", batch), ("group_size", group)):
            if value is not None:
                base[key] = max(1, round(value)) if key != "seed" else int(value)
        self.settings = _adapter_sampling(
            TfGrpoSettings(**{**base, **settings}), {"policy": model, "optimizer": optimizer_model}
        )
        self.optimizer_model = optimizer_model
        steps = _read(args, "max_steps")  # transformers' TrainingArguments: -1 means the epochs
        self.max_steps: int | None = int(steps) if steps is not None and steps > 0 else None
        if train_dataset is None:
            self.train_dataset, demo_eval = default_datasets(args, finetuning_args)
            self.eval_dataset = eval_dataset if eval_dataset is not None else demo_eval

    def _clients(self) -> tuple[dict[str, LLMClient], str | None]:
        clients: dict[str, LLMClient] = {}
        name: str | None = None
        if hasattr(self.model, "complete") and hasattr(self.model, "identity"):
            clients["policy"] = self.model
        elif hasattr(self.model, "generate") and hasattr(self.model, "config"):
            if self.tokenizer is None:
                raise ConfigError("a transformers model needs tokenizer= too")
            clients["policy"] = LoadedClient(self.model, self.tokenizer, template=self.template)
        else:
            name = str(getattr(self.model, "name", self.model))
        if self.optimizer_model is not None:
            clients["optimizer"] = self.optimizer_model
        return clients, name

    def train(self) -> Any:
        """training_free=True: learn experiences over train_dataset (weights untouched) and return the
        run's numbers (RunResult). training_free=False: online GRPO; returns TRL's TrainOutput."""
        if not self.training_free:
            from gym.train.grpo.online_trainer import train_online

            return train_online(
                self.model,
                self.tokenizer,
                self.args,
                self.finetuning_args,
                self.train_dataset,
                template=self.template,
                reward_funcs=self.reward_funcs,
                rl=self.rl,
            )
        s = self.settings
        questions, digest = questions_of(self.train_dataset, s.max_train_questions)
        held_out = (
            questions_of(self.eval_dataset, s.max_eval_questions, "max_eval_questions")[0]
            if self.eval_dataset
            else None
        )
        clients, name = self._clients()

        def make(start: Library | None) -> Runtime:
            tmpl, fresh = self.template, self.refresh
            return Runtime(
                s, model=name, dataset=digest, clients=clients, template=tmpl, start=start, refresh=fresh
            )

        folder = self.experience_manager.library_path
        existing = folder / EXPERIENCE_FILE if folder is not None else None
        writer = written_by(existing) if existing is not None and existing.is_file() else None
        versions = folder / "versions" if folder is not None else None
        rt = with_start(make, self.experience_manager.library, writer, versions)
        self.result = train(rt, questions, held_out, initial=rt.start, max_steps=self.max_steps)
        self.experience_manager.library = Library.load(self.result.library_file)
        if folder is not None:  # every version the run made, as the CLI's --experience_lib_path keeps them;
            # experiences.json records the run that wrote it, so that running this again resumes that run
            export_library(rt.run_dir, folder, s.retrieval_top_k, rt.origin)
        output_dir = _read(self.args, "output_dir")
        if output_dir:
            self.save_model(output_dir)
        return self.result

    def save_model(self, output_dir: str | Path) -> Path:
        """The model and its experiences.json: a model in memory saved, a registry name's or a local
        folder's files linked in (as gym train's --output_dir ships them, servable with gym serve); a
        model known only to an API endpoint has no files, so the library alone."""
        target = Path(output_dir)
        target.mkdir(parents=True, exist_ok=True)
        if hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(target, safe_serialization=True)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(target)
        elif isinstance(self.model, str | Path) and (ref := self._local_model()) is not None:
            from gym.train.tf_grpo import link_model_files

            link_model_files(ref, target)
            meta = {"method": "tf_grpo", "base_model": ref.base_model, "template": ref.template or None}
            if ref.default_system is not None:
                meta["default_system"] = ref.default_system
            workspace.atomic_write_json(target / "gym_model.json", meta)
        top_k = self.settings.retrieval_top_k if self.training_free else None
        self.experience_manager.export(target, top_k)  # with K: serving injects what training did
        return target

    def _local_model(self) -> Any:
        """The ModelRef of a model given by name or folder whose files are here (or in the hub cache);
        None for a name only an API endpoint knows."""
        from gym.models import ModelRef, resolve

        try:
            return resolve(str(self.model), self.template)
        except ConfigError:
            folder = Path(str(self.model)).expanduser()
            if not (folder / "config.json").is_file():
                return None
            # a model folder gym can't name a template for (none given): its files, its own template
            return ModelRef(
                name=folder.name, path=str(folder), template="", digest="", base_model=str(folder)
            )
