"""A model trained with a default system message (the data's `default_system`) keeps expecting it:
the training stage records it with the model and writes it into the saved tokenizer's chat template,
a later stage inherits it, and serving, evaluation, export (tokenizer, Ollama's SYSTEM, card) and a
registered MLflow version all open conversations without a system message with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gym import tracking, train
from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.eval.exact_match import evaluate
from gym.export import ExportSettings, export_model
from gym.lineage import Lineage
from gym.models import MODEL_META, derived, resolve
from gym.registration import register
from gym.serve.engine import Engine
from gym.serve.loading import resolve_served
from gym.templates import list_templates, load_template, with_default_system, with_system
from gym.tfgrpo.injection import ShippedLibrary
from gym.train import TrainConfig
from tests.helpers import tiny, tokenized

pytestmark = pytest.mark.xdist_group("default-system")  # one worker trains the module's model once

SAID = 'Answer in one word. Quotes " and a brace %} stay as written.'
USER = [{"role": "user", "content": "What is 2+2?"}]
OWN = [{"role": "system", "content": "Talk like a pirate."}, *USER]
STEPS = TrainConfig(
    method="sft", learning_rate=1e-3, max_steps=2, per_device_train_batch_size=4, save_steps=1
)


def opens_with_said(text: str) -> bool:
    return text.startswith(f"<|im_start|>system\n{SAID}<|im_end|>")


@pytest.mark.parametrize("name", list_templates())
def test_the_template_with_a_default_system_renders_what_training_rendered(name):
    """The Jinja prelude adds exactly what `with_system` adds to the data: same text, every template."""
    from transformers.utils.chat_template_utils import render_jinja_template

    text = 'Be "brief" %} {{ not a variable }}\n\\ — ü 😀'
    turns = [*USER, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    for conversation in (turns, [{"role": "system", "content": "own"}, *turns]):
        for prompt in (False, True):
            kwargs = {"add_generation_prompt": prompt, "bos_token": "<s>", "eos_token": "</s>"}
            wrapped = render_jinja_template(
                conversations=[conversation],
                chat_template=with_default_system(load_template(name), text),
                **kwargs,
            )[0]
            trained = render_jinja_template(
                conversations=with_system([conversation], text), chat_template=load_template(name), **kwargs
            )[0]
            assert wrapped == trained
    assert with_default_system(load_template(name), None) == load_template(name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """gym-tiny after two SFT steps on data tokenized with default_system, in a workspace of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("system") / "gym_home"))
        base = tiny()
        return base, train.run(STEPS, base, tokenized("demo_sft", base, max_samples=16, default_system=SAID))


def test_the_stage_records_it_and_its_tokenizer_renders_it(trained):
    base, result = trained
    model_dir = Path(result.model_dir)
    assert json.loads((model_dir / MODEL_META).read_text())["default_system"] == SAID
    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # as vLLM or MLflow's pyfunc would render
    assert opens_with_said(tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True))
    assert SAID not in tokenizer.apply_chat_template(OWN, tokenize=False)
    assert base.default_system is None
    assert derived(base, model_dir, result.digest).default_system == SAID
    assert resolve(str(model_dir)).default_system == SAID


def test_a_later_stage_without_one_inherits_it_and_one_with_its_own_replaces_it(trained):
    base, result = trained
    first = derived(base, Path(result.model_dir), result.digest)
    again = train.run(STEPS, first, tokenized("demo_sft", first, max_samples=16))
    assert resolve(again.model_dir).default_system == SAID
    other = "Be terse."
    replaced = train.run(STEPS, first, tokenized("demo_sft", first, max_samples=16, default_system=other))
    assert resolve(replaced.model_dir).default_system == other


def test_serving_and_evaluation_open_conversations_with_it(trained):
    _, result = trained
    served = resolve_served(result.model_dir)
    assert served.ref.default_system == SAID
    with Engine.load(result.model_dir) as engine:
        assert opens_with_said(engine.render_chat(USER))
        assert SAID not in engine.render_chat(OWN)
    # a TF-GRPO library goes into the system message after the default one, not instead of it
    with Engine.load(result.model_dir) as engine:
        engine.library = ShippedLibrary(texts=["Check the units."])
        system_turn = engine.render_chat(USER).split("<|im_end|>")[0]
    assert system_turn.startswith(f"<|im_start|>system\n{SAID}\n\n") and "Check the units." in system_turn
    # `gym serve --system` replaces it, in the engine and in the template a vLLM backend would get
    other = "Be terse."
    assert resolve_served(result.model_dir, system=other).chat_template.count(other) == 1
    with Engine.load(result.model_dir, system=other) as engine:
        prompt = engine.render_chat(USER)
    assert prompt.startswith(f"<|im_start|>system\n{other}<|im_end|>") and SAID not in prompt
    data = ingest(resolve_dataset("demo_sft_eval"))
    scored = evaluate(resolve(result.model_dir), Path(data.path), limit=2, max_new_tokens=2)
    assert all(opens_with_said(s["prompt"]) for s in scored.samples)


def test_a_checkpoint_served_opens_conversations_with_it(trained):
    """A checkpoint (an interrupted run's, or an earlier step's) was served with its tokenizer's template
    and no system message: the same weights as model/ answered another prompt."""
    _, result = trained
    checkpoints = sorted((Path(result.stage_dir) / "checkpoints").glob("checkpoint-*"))
    assert [c.name for c in checkpoints] == ["checkpoint-1", "checkpoint-2"]
    for checkpoint in checkpoints:
        served = resolve_served(str(checkpoint))
        assert (served.ref.default_system, served.template_name) == (SAID, "chatml")
        with Engine.load(str(checkpoint)) as engine:
            assert opens_with_said(engine.render_chat(USER))


def test_export_and_registration_carry_it(trained, tmp_path):
    _, result = trained
    out = export_model(result.stage_dir, tmp_path / "hub", ExportSettings(ollama=True))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert opens_with_said(tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True))
    assert json.loads((out / MODEL_META).read_text())["default_system"] == SAID
    assert f'SYSTEM """{SAID}"""' in (out / "Modelfile").read_text()
    assert "default system message" in (out / "README.md").read_text()

    lineage = Lineage(base_model="gym-tiny", template="chatml", default_system=SAID)
    register(Path(result.model_dir), "tiny-system", lineage, tracking.start_run("register"))
    assert resolve("models:/tiny-system@challenger").default_system == SAID
    with Engine.load("models:/tiny-system@challenger") as engine:
        assert opens_with_said(engine.render_chat(USER))


def test_training_free_grpo_on_it_rolls_out_and_ships_with_it(trained, tmp_path):
    """A TF-GRPO policy run locally opens its rollout prompts with the system message (the library's
    block after it), and the model it ships expects it, so serving and evaluation render as it learnt."""
    from gym.tfgrpo.config import TfGrpoSettings
    from gym.tfgrpo.data import Question
    from gym.tfgrpo.library import Library
    from gym.tfgrpo.ops import Add, apply
    from gym.tfgrpo.runtime import Runtime
    from gym.tfgrpo.stages import policy_messages

    _, result = trained
    rt = Runtime(TfGrpoSettings(), model=result.model_dir, run_dir=tmp_path / "run")
    library = apply(Library(), [Add(text="Check the units.")]).library
    messages = policy_messages(rt, Question(id="q", prompt=USER), library)
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith(f"{SAID}\n\n")
    assert "Check the units." in messages[0]["content"] and messages[1:] == USER
    own = policy_messages(rt, Question(id="q", prompt=OWN), library)
    assert own[0]["content"].startswith("Talk like a pirate.") and SAID not in own[0]["content"]
    assert Runtime(TfGrpoSettings(), model="gym-tiny", run_dir=tmp_path / "base").default_system is None

    # the shipped model (weights linked, library beside them) expects it too
    from gym.tfgrpo.engine import RunResult
    from gym.train.tf_grpo import prepare, ship

    run = prepare(TfGrpoSettings(reward="majority"), result.model_dir, [Question(id="q", prompt=USER)], "d")
    library_file = tmp_path / "library.json"
    library.save(library_file)
    counts = dict.fromkeys(("library_size", "library_version", "steps", "degraded_steps", "llm_calls"), 1)
    counts |= dict.fromkeys(("tokens", "paid_calls", "cached_calls", "cost_usd", "seconds"), 0)
    done = RunResult(
        run_dir=run.run_dir,
        library_file=str(library_file),
        library_hash="h",
        mean_at_k=[],
        pass_at_k=[],
        train_reward_first=None,
        train_reward_last=None,
        **counts,
    )
    shipped = ship(run, done, resolve(result.model_dir))
    assert resolve(str(shipped)).default_system == SAID


def test_a_folder_that_records_none_expects_none(trained, tmp_path):
    """What a folder's gym metadata says wins over what the model it came from expected."""
    base, result = trained
    first = derived(base, Path(result.model_dir), result.digest)
    other = tmp_path / "other"
    other.mkdir()
    (other / MODEL_META).write_text(json.dumps({"template": "chatml", "base_model": "gym-tiny"}))
    assert first.default_system == SAID and derived(first, other, "x").default_system is None


def test_the_modelfile_holds_the_system_message_verbatim_or_says_why_not():
    """Ollama's Modelfile strings have no escapes: a triple-quoted block holds any text but \"\"\"."""
    from gym.ollama import modelfile

    two_lines = 'Be brief.\nSay "yes" or "no".'
    assert f'SYSTEM """{two_lines}"""\n' in modelfile("chatml", "<|im_end|>", system=two_lines)
    refused = modelfile("chatml", "<|im_end|>", system='Quote """this"""')
    assert "SYSTEM" not in refused.replace("# No SYSTEM", "") and "# No SYSTEM: the default" in refused
