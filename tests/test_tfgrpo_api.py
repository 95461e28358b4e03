"""The Gym papers' Python API, as written: ExperienceManager, semantic_extractor, api_model_adapter,
GRPOTrainer(..., experience_manager=..., training_free=True).train(); embedding retrieval."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gym.errors import ConfigError
from gym.tfgrpo.clients import Completion, Usage
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question
from gym.tfgrpo.injection import experience_block, load_shipped
from gym.tfgrpo.ops import Add, Update
from gym.tfgrpo.runtime import Runtime
from gym.tfgrpo.sim import SimEnv, SimOptimizer, SimPolicy
from gym.train.grpo import GRPOTrainer
from gym.train.grpo.api_model_adapter import APIModelAdapter
from gym.train.grpo.experience_manager import ExperienceManager
from gym.train.grpo.semantic_extractor import SemanticExtractor
from tests.tfgrpo_fakes import FakeEndpoint


def test_experience_manager_crud_versions_and_prompt_format(tmp_path):
    em = ExperienceManager(library_path=tmp_path / "experience_lib", max_size=3)
    a = em.add("When adding, carry the tens.")
    b = em.add("When comparing, check the signs.")
    em.modify("G0", "When adding columns, carry the tens.")  # the prompt's alias works as an id
    assert em.get(a) == "When adding columns, carry the tens." and em.version == 3
    m = em.merge([a, "[G1]"], "When adding or comparing, carry tens and check signs.")
    assert len(em) == 1 and m not in (a, b) and em.experiences == [{"id": m, "text": em.get(m)}]
    with pytest.raises(ConfigError, match="unknown id"):
        em.delete(a)  # merged away: its id is gone for good
    with pytest.raises(ConfigError, match="over the cap"):
        em.add(" ".join(["word"] * 33))
    em.add("x y")
    em.add("z w")
    with pytest.raises(ConfigError, match="library full"):
        em.add("one more")
    assert em.format_for_prompt() == experience_block(em.library.texts)
    saved = em.save()
    assert saved.name == "experiences.json" and len(em.versions()) == 1
    final = em.save(tmp_path / "experience_lib" / "final.json")
    again = ExperienceManager.load(final)
    assert again.library == em.library and load_shipped(saved.parent) == em.library.texts
    reopened = ExperienceManager(library_path=tmp_path / "experience_lib", max_size=3)
    assert reopened.library == em.library
    # Caps given with a saved library apply (they were ignored); below what it holds, refused.
    wider = ExperienceManager(library_path=tmp_path / "experience_lib", max_size=5, max_words=40)
    assert (wider.library.max_items, wider.library.max_words) == (
        5,
        40,
    ) and wider.library.items == em.library.items
    assert ExperienceManager(library_path=tmp_path / "experience_lib").library.max_items == 3  # its own
    with pytest.raises(ConfigError, match=r"holds 3 experiences .*max_size=1, max_words=32 are below that"):
        ExperienceManager(library_path=tmp_path / "experience_lib", max_size=1)
    result = em.apply_operations(
        [{"operation": "delete", "id": "G0"}, {"operation": "update", "id": "G9", "text": "t"}]
    )
    assert len(result.applied) == 1 and len(em) == 2 and "**removed**" in em.diff_markdown(reopened)
    # What is no operation at all is reported too (it was dropped without a trace), numbered as given;
    # an Op object beside dicts is applied as it is.
    result = em.apply_operations(
        [
            {"operation": "update", "id": "G77", "text": "When z, q."},
            {"operation": "frobnicate"},
            Add(text="When a list is empty, say so."),
            "delete everything",
        ]
    )
    assert len(result.applied) == 1 and not result.rejected and len(em) == 3
    assert [u.split(":")[0] for u in result.unreadable] == ["operation 1", "operation 2", "operation 4"]
    assert "G77" in result.unreadable[0] and "frobnicate" in result.unreadable[1]
    assert (
        em.apply_operations('[{"operation": "delete", "id": "G5"}]').unreadable[0].startswith("operation 1:")
    )


@pytest.mark.slow  # loads sentence-transformers and the embedding model (~5-20 s here)
def test_search_and_training_retrieval_use_the_offline_embedding_model():
    em = ExperienceManager(max_size=10)
    for text in [
        "When a problem asks for a remainder, use modular arithmetic.",
        "When writing a poem, keep the rhyme scheme consistent.",
        "When reversing digits, read the number from right to left.",
    ]:
        em.add(text)
    best, score = em.search("What is 17 mod 5?", k=1)[0]
    assert "remainder" in best and 0 < score <= 1
    settings = TfGrpoSettings(retrieval_top_k=2)
    rt = Runtime(settings, model=None, clients={"policy": SimPolicy(SimEnv())}, run_dir=None)
    chosen = rt.experiences_for(
        Question(id="0", prompt=[{"role": "user", "content": "Reverse 123"}]), em.library
    )
    assert len(chosen) == 2 and "reversing" in " ".join(chosen)
    assert chosen == [t for t in em.library.texts if t in chosen]  # library order kept


class Scripted:
    identity, max_n = "scripted", 1

    def __init__(self, replies):
        self.replies, self.seen = list(replies), []

    def complete(self, messages, *, temperature, max_tokens, seed, n=1):
        self.seen.append(messages)
        text = self.replies.pop(0)
        return Completion(texts=[text] * n, usage=Usage(prompt_tokens=1, completion_tokens=1))


def test_semantic_extractor_runs_the_three_stages(tmp_path):
    em = ExperienceManager()
    em.add("When adding, carry tens.")
    llm = Scripted(
        [
            "It carried the tens and got 42.",
            "oops, no json",
            '[{"operation": "modify", "id": "G0", "text": "When adding, carry tens first."}]',
            '```json\n[{"option": "add", "experience": "When checking, re-add."},]\n```',
        ]
    )
    ex = SemanticExtractor(llm, cache_dir=tmp_path)
    summary = ex.summarize_trajectory("20+22?", "42", reward=1.0, reference="42", library=em)
    assert summary == "It carried the tens and got 42." and "[G0] When adding" in llm.seen[0][1]["content"]
    ops = ex.extract_group_advantage("20+22?", [summary, "It guessed."], [1.0, 0.0], em)
    assert ops == [Update(id="E0", text="When adding, carry tens first.")] and ex.last_errors == []
    assert "could not be used" in llm.seen[2][-1]["content"]  # one repair turn
    final = ex.consolidate_batch(em, [ops])
    assert final == [Add(text="When checking, re-add.")]
    assert ex.consolidate_batch(em, [[]]) == [] and len(llm.seen) == 4  # nothing proposed: no call
    assert SemanticExtractor.parse_operations('[{"op": "delete", "id": 0}]', em)[0][0].id == "E0"


def test_api_model_adapter_over_http(monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-ds")
    deepseek = APIModelAdapter.deepseek()
    assert deepseek.base_url == "https://api.deepseek.com/v1" and deepseek.model == "deepseek-chat"
    endpoint = FakeEndpoint(lambda body: f"echo {body['messages'][-1]['content']}")
    with endpoint as url:
        adapter = APIModelAdapter("m", base_url=url, api_key_env="DEEPSEEK_API_KEY")
        assert adapter.generate("hi", system="be brief") == "echo hi"
    assert endpoint.requests[0]["messages"][0] == {"role": "system", "content": "be brief"}
    assert endpoint.headers[0]["authorization"] == "Bearer sk-ds"


def test_an_api_model_adapter_as_the_policy_samples_as_it_was_made_to(monkeypatch, tmp_path):
    """Its max_tokens and temperature reached no request: the policy role's defaults (512, 0.7) did."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    endpoint = FakeEndpoint(lambda body: "4")
    rows = [{"question": "What is 2+2?", "answer": "4"}, {"question": "And 1+3?", "answer": "4"}]
    with endpoint as url:
        adapter = APIModelAdapter("m", base_url=url, max_tokens=64, temperature=0.2)
        trainer = GRPOTrainer(model=adapter, train_dataset=rows, group_size=2, epochs=1, batch_size=2)
        trainer.train()
    policy = [r for r in endpoint.requests if r["messages"][-1]["content"] in ("What is 2+2?", "And 1+3?")]
    assert policy and {(r["max_tokens"], r["temperature"]) for r in policy} == {(64, 0.2)}
    # The role's own settings still win over the adapter's.
    mine = GRPOTrainer(model=adapter, train_dataset=rows, policy={"max_tokens": 32})
    assert (mine.settings.policy.max_tokens, mine.settings.policy.temperature) == (32, 0.2)


def test_grpo_trainer_training_free_learns_into_the_experience_manager(tmp_path):
    env = SimEnv(seed=2, families=4, train_per_family=3, eval_per_family=2)
    train_q, eval_q = env.questions()
    records = [{"question": q.text, "answer": q.answer} for q in train_q]
    exp_manager = ExperienceManager(library_path=tmp_path / "experience_lib", max_size=100)
    trainer = GRPOTrainer(
        model=SimPolicy(env),
        args=SimpleNamespace(num_train_epochs=2, seed=2, output_dir=str(tmp_path / "out")),
        finetuning_args={"grpo_group_size": 4},
        experience_manager=exp_manager,
        training_free=True,
        train_dataset=records,
        eval_dataset=eval_q,
        optimizer_model=SimOptimizer(),
        reward="numeric",
        batch_size=4,
    )
    assert trainer.settings.group_size == 4 and trainer.settings.epochs == 2
    result = trainer.train()
    assert result.mean_at_k[-1] > result.mean_at_k[0] and len(exp_manager) == result.library_size > 0
    assert exp_manager.versions() and load_shipped(tmp_path / "out") == exp_manager.library.texts
    # every version the run made, as `--experience_lib_path` keeps them (only the last was kept)
    made = sorted(p.name for p in (Path(result.run_dir) / "libraries").glob("v*.json"))
    assert len(made) > 2 and [p.name for p in exp_manager.versions()] == made
    exp_manager.save(tmp_path / "experience_lib" / "final.json")
    assert json.loads((tmp_path / "experience_lib" / "final.json").read_text())["items"]
    with pytest.raises(ConfigError, match=r"\['group_size'\] apply only to training_free=True"):
        GRPOTrainer(model="gym-tiny", training_free=False, group_size=5)


class Answers:
    """A policy client that answers every question the same way (nothing to learn: no optimizer calls)."""

    identity, max_n = "answers", 8

    def __init__(self, text="4"):
        self.text, self.calls = text, 0

    def complete(self, messages, *, temperature, max_tokens, seed, n=1):
        self.calls += 1
        return Completion(texts=[self.text] * n, usage=Usage(prompt_tokens=3, completion_tokens=1))


def test_train_config_max_steps_caps_the_steps_of_gym_train_run(tmp_path, monkeypatch):
    """TrainConfig(method="tf_grpo", max_steps=2, num_train_epochs=1) ran every planned step: max_steps
    is the number of TF-GRPO steps (a batch of questions each), instead of the epochs, as for every
    other method: it stops inside an epoch or runs on into more."""
    from gym.data.ingest import ingest
    from gym.models import ModelRef
    from gym.tfgrpo.data import dataset_spec, plan_steps
    from gym.train import TrainConfig, run

    data = tmp_path / "qa.jsonl"  # 20 questions: 3 steps of 8 per epoch
    data.write_text(
        "".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(20))
    )
    ingested = ingest(dataset_spec(str(data))).path
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    model = ModelRef(name="m", path=str(weights), template="chatml", digest="d", base_model="m")
    policy = Answers()
    monkeypatch.setattr("gym.tfgrpo.runtime.client_for", lambda role, *a, **k: policy)
    capped = run(TrainConfig(method="tf_grpo", max_steps=2, num_train_epochs=1, seed=3), model, ingested)
    assert capped.global_step == 2 and policy.calls == 2 * 8  # a call (of n=5) per question
    for max_steps, epochs, steps in ((5, 1, 5), (-1, 1, 3), (2, None, 2)):
        config = TrainConfig(method="tf_grpo", max_steps=max_steps, num_train_epochs=epochs, seed=3)
        assert run(config, model, ingested).global_step == steps, (max_steps, epochs)
    # A capped plan is the start of the full one (epochs beyond are planned the same): a longer run resumes.
    assert plan_steps(20, 8, 3, 3, max_steps=7) == plan_steps(20, 8, 3, 3)[:7]
    assert plan_steps(20, 8, 1, 3, max_steps=5) == plan_steps(20, 8, 2, 3)[:5]
    with pytest.raises(ConfigError, match="max_steps must be 1 or more"):
        plan_steps(20, 8, 1, 3, max_steps=0)


def test_save_model_of_a_model_named_or_in_a_folder_is_a_servable_folder(gym_home, tmp_path):
    """With model="gym-tiny" (or a folder), save_model wrote experiences.json alone: gym serve refused
    the folder (no config.json), though the papers save experiences with the model."""
    from gym.models import load_model, resolve

    records = [{"question": "1+1?", "answer": "2"}]
    for given, template in (("gym-tiny", None), (resolve("gym-tiny").path, "chatml")):
        trainer = GRPOTrainer(
            model=given, template=template, training_free=True, train_dataset=records, group_size=2
        )
        saved = trainer.save_model(tmp_path / Path(str(given)).name)
        assert (saved / "experiences.json").is_file() and (saved / "model.safetensors").is_file()
        ref = resolve(str(saved))
        assert (ref.base_model, ref.template) == (given, "chatml")
        assert load_model(ref).config.model_type == "llama"
    # A model only an endpoint knows has no files: the library alone, as before.
    named = GRPOTrainer(model="some-api-model", training_free=True, train_dataset=records, group_size=2)
    assert sorted(p.name for p in named.save_model(tmp_path / "api").iterdir()) == ["experiences.json"]


def test_grpo_trainer_reads_max_steps_from_its_training_args(tmp_path):
    records = [{"question": f"{i}+{i}?", "answer": str(2 * i)} for i in range(6)]
    args = SimpleNamespace(max_steps=4, num_train_epochs=1, per_device_train_batch_size=2, seed=1)
    result = GRPOTrainer(model=Answers(), args=args, train_dataset=records, group_size=2).train()
    assert result.steps == 4  # 3 steps an epoch: into the second
    unset = SimpleNamespace(max_steps=-1, num_train_epochs=1, per_device_train_batch_size=2, seed=1)
    assert GRPOTrainer(model=Answers(), args=unset, train_dataset=records, group_size=2).train().steps == 3


def test_the_papers_snippet_runs_as_written_on_the_demo_questions(tmp_path, capsys):
    """The papers' Python API passes no train_dataset (GRPOTrainer(model=..., tokenizer=..., args=...,
    finetuning_args=..., experience_manager=..., training_free=True)) and failed with "GRPOTrainer needs
    train_dataset"; it learns from the demo questions, as `gym train --method tf_grpo` without --dataset."""
    exp_manager = ExperienceManager(library_path=tmp_path / "experience_lib", max_size=100)
    trainer = GRPOTrainer(
        model=Answers(),
        tokenizer=None,
        args=SimpleNamespace(max_steps=1, seed=1),
        finetuning_args=SimpleNamespace(grpo_group_size=2),
        experience_manager=exp_manager,
        training_free=True,
        max_eval_questions=2,
        eval_samples=1,
    )
    note = capsys.readouterr().err
    assert "note: GRPOTrainer: no train_dataset given: learning from gym's demo questions (demo_sft)" in note
    assert "held-out Mean@k on demo_sft_eval" in note and "pass train_dataset=" in note
    assert (trainer.train_dataset, trainer.eval_dataset) == ("demo_sft", "demo_sft_eval")
    result = trainer.train()
    assert result.steps == 1 and len(result.mean_at_k) == 2  # before, and after its one step
    # Data named where LLaMA-Factory's data arguments name it is used, without a note.
    capsys.readouterr()
    named = GRPOTrainer(model=Answers(), args=SimpleNamespace(dataset="demo_prompts"), training_free=True)
    assert (named.train_dataset, named.eval_dataset) == ("demo_prompts", None)
    assert "note:" not in capsys.readouterr().err
    given = GRPOTrainer(model=Answers(), train_dataset="demo_prompts", training_free=True)
    assert (given.train_dataset, given.eval_dataset) == ("demo_prompts", None)


def test_bad_input_fails_before_any_call_with_a_clear_error(tmp_path):
    from gym.train.tf_grpo import prepare, prepare_from_datasets

    with pytest.raises(ConfigError, match=r"needs questions \(an sft dataset.* is preference"):
        prepare_from_datasets(TfGrpoSettings(), "policy", "demo_dpo")
    no_answer = [Question(id="0", prompt=[{"role": "user", "content": "hi"}])]
    with pytest.raises(ConfigError, match=r"training record 1 of --dataset has no answer.*--reward majority"):
        prepare(TfGrpoSettings(endpoint="http://127.0.0.1:9/v1"), "policy", no_answer, "d")
    # Held-out questions without answers scored every answer 0 (Mean@k 0.0 before and after): refused.
    answered = [Question(id="0", prompt=[{"role": "user", "content": "1+1?"}], answer="2")]
    majority = TfGrpoSettings(endpoint="http://127.0.0.1:9/v1", reward="majority")
    with pytest.raises(ConfigError, match=r"held-out record 1 \(and 1 more\) of --eval-dataset has no"):
        prepare(majority, "policy", no_answer, "d", eval_questions=[*no_answer, *no_answer])
    assert prepare(majority, "policy", no_answer, "d", eval_questions=answered).start is None


def test_a_group_of_one_is_said_to_learn_nothing(caplog):
    from gym.train.tf_grpo import prepare

    questions = [Question(id="0", prompt=[{"role": "user", "content": "1+1?"}], answer="2")]
    prepare(TfGrpoSettings(endpoint="http://127.0.0.1:9/v1", group_size=2), "policy", questions, "d")
    assert "learns nothing" not in caplog.text
    prepare(TfGrpoSettings(endpoint="http://127.0.0.1:9/v1", group_size=1), "policy", questions, "d")
    assert "TF-GRPO with group_size 1 learns nothing" in caplog.text
    with pytest.raises(ConfigError, match="has no model"):
        TfGrpoSettings().role("policy", None)


def test_questions_come_from_prompt_data_and_question_files_with_or_without_answers(gym_home, tmp_path):
    """Online RL's prompt format and files of questions read as questions; without answers they are
    for --reward majority (or judge) only."""
    from gym.tfgrpo.data import load_questions
    from gym.train.tf_grpo import prepare

    files = {
        "prompts.jsonl": [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "What is 3+3?"}],
        "questions.jsonl": [{"question": "What is 2+2?"}, {"question": "What is 3+3?"}],
        "qa.jsonl": [{"question": "What is 2+2?", "answer": "4"}, {"question": "What is 3+3?", "answer": 6}],
        # as the Python API reads them (it was refused from a file, naming 'question' and 'prompt')
        "math.jsonl": [{"problem": "What is 2+2?", "solution": "4"}, {"problem": "What is 3+3?"}],
    }
    read = {}
    for name, rows in files.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        read[name] = load_questions(str(tmp_path / name))[0]
    user = [{"role": "user", "content": "What is 3+3?"}]
    assert [(q.prompt, q.answer) for q in read["prompts.jsonl"]][1] == (user, None)
    assert [q.answer for q in read["prompts.jsonl"]] == ["4", None]
    assert [q.answer for q in read["questions.jsonl"]] == [None, None]
    assert [(q.prompt, q.answer) for q in read["qa.jsonl"]][1] == (user, "6")
    math = [(q.prompt[-1]["content"], q.answer) for q in read["math.jsonl"]]
    assert math == [("What is 2+2?", "4"), ("What is 3+3?", None)]
    endpoint = TfGrpoSettings(endpoint="http://127.0.0.1:9/v1", policy={"model": "policy"})
    with pytest.raises(ConfigError, match="use --reward majority"):
        prepare(endpoint, "policy", read["questions.jsonl"], "d")
    run = prepare(endpoint.model_copy(update={"reward": "majority"}), "policy", read["questions.jsonl"], "d")
    assert run.steps and all(sorted(s.questions) == [0, 1] for s in run.steps)
    assert load_questions("demo_prompts", limit=2)[0][0].answer  # the demo's prompts carry answers


def test_flow_configs_select_tf_grpo_and_pass_preflight():
    import socket

    from gym import preflight
    from gym.data.tokenize import TokenizeSettings
    from gym.pipeline import TfGrpoFlowConfig, TrainFlowConfig
    from gym.train.config import TrainConfig

    train_flow = TrainFlowConfig(
        dataset="demo_sft",
        train=TrainConfig(method="tf_grpo", num_train_epochs=2, seed=7),
        benchmarks=["mmlu=./mmlu"],
        benchmark_options={"limit": 3},
    )
    preflight.check(train_flow)  # tf_grpo is a known method; gym-tiny resolves
    config = TfGrpoFlowConfig.from_train_flow(train_flow)
    assert (config.epochs, config.seed, config.group_size, config.dataset) == (2, 7, 5, "demo_sft")
    assert config.benchmarks == ["mmlu=./mmlu"] and config.benchmark_options.limit == 3  # not dropped
    assert config.steps is None  # the epochs decide
    capped = TfGrpoFlowConfig.from_train_flow(
        train_flow.model_copy(update={"train": TrainConfig(max_steps=3)})
    )
    assert capped.steps == 3  # `gym train --method tf_grpo --max-steps 3`: 3 TF-GRPO steps
    from flows.runner import build_parser, parse_config

    for flag, steps in (("--max-steps", 2), ("--max_steps", 4), ("--steps", 5)):
        parsed = parse_config(TfGrpoFlowConfig, build_parser(TfGrpoFlowConfig).parse_args([flag, str(steps)]))
        assert parsed.steps == steps
    from gym.errors import GymError

    for zero in ("0", "-3"):  # --max-steps 0 ran every epoch, as if unset; TrainConfig refuses it
        with pytest.raises(GymError, match=f"--max-steps {zero}: give 1 or more steps"):
            parse_config(TfGrpoFlowConfig, build_parser(TfGrpoFlowConfig).parse_args(["--max-steps", zero]))
    unset = parse_config(TfGrpoFlowConfig, build_parser(TfGrpoFlowConfig).parse_args(["--max-steps", "-1"]))
    assert unset.steps is None
    with pytest.raises(ConfigError, match="tf_grpo writes its own prompts"):  # would not reach them
        data = TokenizeSettings(default_system="Be brief.")
        TfGrpoFlowConfig.from_train_flow(train_flow.model_copy(update={"data": data}))
    with socket.socket() as listening:  # an endpoint that answers: the remote model is not looked up
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/v1"
        preflight.check(TfGrpoFlowConfig(endpoint=url, model="deepseek-chat"))
        preflight.check(TfGrpoFlowConfig(model="gym-tiny", optimizer={"endpoint": url}))
    # Nothing answers there now: every call would fail, after its retries, and the run say so at its end
    with pytest.raises(ConfigError, match=rf"^endpoint: {url}: nothing answers at 127.0.0.1:\d+: conn"):
        preflight.check(TfGrpoFlowConfig(endpoint=url, model="deepseek-chat"))
    with pytest.raises(
        ConfigError, match=r"^optimizer.endpoint: .*start the server, or point --optimizer.endpoint"
    ):
        preflight.check(TfGrpoFlowConfig(model="gym-tiny", optimizer={"endpoint": url}))
    with pytest.raises(ConfigError, match="model: unknown model"):
        preflight.check(TfGrpoFlowConfig(model="deepseek-chat"))  # local: must resolve


@pytest.mark.parametrize("endpoint", ["not-a-url", "localhost:8000/v1", "ftp://host/v1"])
def test_an_endpoint_that_is_not_an_http_url_is_refused_up_front(endpoint):
    """`--endpoint not-a-url` ran the whole default run of failing calls (over 5 minutes)."""
    from pydantic import ValidationError

    from gym.pipeline import TfGrpoFlowConfig
    from gym.tfgrpo.config import RoleSettings

    with pytest.raises(ValidationError, match="an http\\(s\\) URL of an OpenAI-compatible API"):
        TfGrpoFlowConfig(endpoint=endpoint)
    with pytest.raises(ValidationError, match="an http\\(s\\) URL"):
        RoleSettings(endpoint=endpoint)
    assert TfGrpoFlowConfig(endpoint="https://api.example.com/v1").endpoint == "https://api.example.com/v1"


def sim_trainer(env, library_path, epochs=1):
    train_q, eval_q = env.questions()
    return GRPOTrainer(
        model=SimPolicy(env),
        args=SimpleNamespace(num_train_epochs=epochs, seed=2),
        finetuning_args={"grpo_group_size": 4},
        experience_manager=ExperienceManager(library_path=library_path, max_size=100),
        training_free=True,
        train_dataset=[{"question": q.text, "answer": q.answer} for q in train_q],
        eval_dataset=eval_q,
        optimizer_model=SimOptimizer(),
        reward="numeric",
        batch_size=4,
    )


def test_a_library_a_run_wrote_resumes_it_and_a_library_given_starts_a_new_run(tmp_path, caplog):
    """Re-running with the experience library path a run wrote to started a second run from the first's
    final library, in the same run directory (the config hash left the start out), overwriting its
    records: its `before` was no longer the untrained model's. Now the run's own output resumes it, and
    a library given to start from is part of the config hash (a new run, announced)."""
    from pathlib import Path

    from gym.tfgrpo.library import Experience, Library

    env = SimEnv(seed=2, families=4, train_per_family=3, eval_per_family=2)
    first = sim_trainer(env, tmp_path / "lib").train()
    assert first.library_size and first.mean_at_k[-1] > first.mean_at_k[0]
    again = sim_trainer(env, tmp_path / "lib").train()
    assert again.run_dir == first.run_dir and again.mean_at_k == first.mean_at_k
    assert again.library_hash == first.library_hash and again.paid_calls == 0
    assert "starts from the library given" not in caplog.text

    item = Experience(id="E0", text="When a sum is asked, add the digits column by column.")
    given = Library(items=(item,), next_id=1)
    given.save(tmp_path / "given" / "experiences.json")
    started = sim_trainer(env, tmp_path / "given").train()
    assert started.run_dir != first.run_dir and "starts from the library given (1 experiences" in caplog.text
    start_file = sorted((Path(started.run_dir) / "libraries").glob("v*.json"))[0]
    assert Library.load(start_file).texts == given.texts  # it began with the given library
    assert json.loads((Path(first.run_dir) / "result.json").read_text())["mean_at_k"] == first.mean_at_k


def test_cost_counts_an_evaluation_repeated_on_an_unchanged_library_once(tmp_path):
    """Three held-out evaluations of an unchanged library make the same calls (the second and third
    answered from the cache) and were billed three times in tokens and cost_usd."""
    records = [{"question": f"{i}+{i}?", "answer": str(2 * i)} for i in range(4)]
    policy = Answers()  # always "4": every group uniform, nothing learned, the library stays empty
    trainer = GRPOTrainer(
        model=policy,
        args=SimpleNamespace(num_train_epochs=2, seed=1),
        train_dataset=records,
        eval_dataset=records[:2],
        group_size=2,
        eval_samples=2,
        batch_size=4,
    )
    result = trainer.train()
    assert len(result.mean_at_k) == 3 and result.library_size == 0
    assert result.tokens == 4 * policy.calls and result.llm_calls == policy.calls  # each call once
