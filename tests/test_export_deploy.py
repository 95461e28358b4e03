"""`gym deploy`: offline it writes exactly the bundle it would push (model repo + chat Space), and the
Space's app answers like gym's own engine; pushing uploads that same bundle."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from gym.deploy import DeployPlan, build, push
from gym.serve.engine import Engine
from gym.tfgrpo.injection import EXPERIENCE_FILE, inject
from tests.serve_fixtures import noisy_tiny


@pytest.fixture()
def model(gym_home, tmp_path) -> Path:
    path = noisy_tiny(tmp_path / "trained")
    (path / "gym_model.json").write_text(json.dumps({"template": "chatml", "base_model": "gym-tiny"}))
    (path / EXPERIENCE_FILE).write_text(json.dumps({"items": [{"id": "a", "text": "Name real places."}]}))
    return path


def test_offline_deploy_writes_the_bundle_and_its_space_chats_like_gym(model, tmp_path, monkeypatch, capsys):
    from flows.cli import main

    target = tmp_path / "deploy"
    assert main(["deploy", "--model_path", str(model), "--target", str(target)]) == 0
    assert "nothing was pushed" in capsys.readouterr().out
    assert json.loads((target / "deploy.json").read_text()) == {
        "model_repo": None,
        "space_repo": None,
        "private": False,
    }
    assert (target / "model" / "model.safetensors").is_file() and (target / "model" / "README.md").is_file()
    assert (target / "model" / EXPERIENCE_FILE).is_file()
    space = target / "space"
    assert sorted(p.name for p in space.iterdir()) == ["README.md", "app.py", "requirements.txt"]
    assert "sdk: gradio" in (space / "README.md").read_text()
    assert "transformers==5.17.0" in (space / "requirements.txt").read_text()

    monkeypatch.chdir(space)  # as on a Space; locally the app finds the model in ../model
    monkeypatch.delenv("MODEL_ID", raising=False)
    app = runpy.run_path(str(space / "app.py"), run_name="space_app")
    question = [{"role": "user", "content": "name a river"}]
    assert app["with_experiences"](question) == inject(question, ["Name real places."])
    *_, reply = app["respond"]("name a river", [], 0, 12)
    with Engine.load(str(target / "model")) as engine:  # gym's engine: template and experiences alike
        assert reply == engine.chat(question, temperature=0, max_tokens=12).choices[0].text
        assert "Name real places." in engine.render_chat(question)
        # A second message: the history as Gradio 6 hands it over (content as a list of parts), and
        # as Gradio 5 did ([user, bot] pairs); either way the model sees the conversation's text.
        from gradio.components.chatbot import Chatbot, ChatbotDataMessages

        parts = [
            {"role": r, "content": [{"type": "text", "text": t}]}
            for r, t in (("user", "name a river"), ("assistant", reply))
        ]
        history = Chatbot().preprocess(ChatbotDataMessages.model_validate(parts))
        *_, second = app["respond"]("and a mountain", history, 0, 12)
        conversation = [
            *question,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "and a mountain"},
        ]
        assert second == engine.chat(conversation, temperature=0, max_tokens=12).choices[0].text
        assert list(app["respond"]("and a mountain", [["name a river", reply]], 0, 12))[-1] == second

        # A conversation longer than the model's window: the app leaves out the oldest exchanges and
        # shortens the reply as `gym chat` does, and answers what gym's engine answers to that.
        from gym.chat import fit

        long = [["tell me about " + "rivers and mountains " * 40, "noted " * 60] for _ in range(3)]
        messages = app["conversation"](long, "and a lake")
        fitted, room, notes = fit(engine, messages, 256)
        assert notes and len(fitted) < len(messages)
        *_, third = app["respond"]("and a lake", long, 0, 256)
        assert third == engine.chat(fitted, temperature=0, max_tokens=room).choices[0].text
        # A message too long on its own: a warning (gr.Warning; off a page, Python's), no reply, and the
        # chat goes on (gr.Error left the page's textbox disabled: tests/test_serve_qa_fixes.py).
        with pytest.warns(UserWarning, match="too long for the model's 512-token window"):
            assert list(app["respond"]("rivers " * 600, [], 0, 12)) == []


class RecordingHub:
    """Stands in for huggingface_hub.HfApi (no hub is reachable here): records what would be sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def create_repo(self, repo_id: str, **kwargs) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs) -> None:
        files = sorted(
            str(p.relative_to(kwargs["folder_path"])) for p in Path(kwargs["folder_path"]).rglob("*")
        )
        self.calls.append(("upload_folder", {**kwargs, "files": files}))


def test_pushing_uploads_the_bundle_folders_to_their_repos(model, tmp_path):
    plan = DeployPlan(model_repo="me/tiny", space_repo="me/tiny-chat", private=True)
    bundle = build(str(model), tmp_path / "bundle", plan, space=True)
    assert 'MODEL_ID = os.environ.get("MODEL_ID", "me/tiny")' in (bundle / "space" / "app.py").read_text()
    hub = RecordingHub()
    urls = push(bundle, plan, hub)
    assert urls == {
        "model": "https://huggingface.co/me/tiny",
        "space": "https://huggingface.co/spaces/me/tiny-chat",
    }
    (_, model_repo), (_, model_upload), (_, space_repo), (_, space_upload) = hub.calls
    assert model_repo == {"repo_id": "me/tiny", "repo_type": "model", "private": True, "exist_ok": True}
    assert (
        model_upload["folder_path"] == str(bundle / "model") and "model.safetensors" in model_upload["files"]
    )
    assert space_repo["repo_type"] == "space" and space_repo["space_sdk"] == "gradio"
    assert space_upload["repo_id"] == "me/tiny-chat" and "app.py" in space_upload["files"]


def test_pushing_needs_a_token_and_the_network_and_never_shows_the_token(gym_home, monkeypatch, capsys):
    from flows.cli import main

    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["deploy", "--model", "gym-tiny", "--push_to_hub"]) == 2
    assert "needs a token" in capsys.readouterr().err
    secret = "hf_secret_value_123"
    assert main(["deploy", "--model", "gym-tiny", "--hf_token", secret, "--push_to_hub"]) == 2
    captured = capsys.readouterr()
    assert "HF_HUB_OFFLINE" in captured.err and secret not in captured.err + captured.out
    assert main(["deploy", "--model", "gym-tiny"]) == 2
    assert "--target DIR" in capsys.readouterr().err
    # A model that isn't there is said first: no token or network would have made the push work.
    missing = str(gym_home / "output" / "qwen3-lora")
    assert main(["deploy", "--model", missing, "--hf_token", secret, "--push_to_hub"]) == 2
    assert f"model {missing!r}: no such directory; give a model folder" in capsys.readouterr().err
    # A token without --push_to_hub: the bundle is written, a note says the token went unused.
    target = gym_home / "bundle"
    assert main(["deploy", "--model", "gym-tiny", "--target", str(target), "--hf_token", secret]) == 0
    captured = capsys.readouterr()
    assert "note: --hf_token is read with --push_to_hub only" in captured.err
    assert secret not in captured.err + captured.out and (target / "model").is_dir()


def test_export_and_deploy_refuse_each_others_folders_saying_whose_they_are(model, tmp_path, capsys):
    """`gym deploy` into an export (and back) said the folder "was not written by gym"."""
    from flows.cli import main

    export, bundle = tmp_path / "export", tmp_path / "bundle"
    assert main(["export", "--model", str(model), "--out", str(export)]) == 0
    assert main(["deploy", "--model", str(model), "--target", str(bundle), "--no-space"]) == 0
    capsys.readouterr()
    for folder, argv, whose in (
        (export, ["deploy", "--model", str(model), "--target", str(export), "--no-space"], "gym export"),
        (bundle, ["export", "--model", str(model), "--out", str(bundle)], "gym deploy"),
    ):
        before = sorted(p.name for p in folder.iterdir())
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"holds what `{whose}` wrote" in err and "not written by gym" not in err
        assert sorted(p.name for p in folder.iterdir()) == before, "left as it was"
    assert main(["export", "--model", str(model), "--out", str(export)]) == 0  # its own: replaced


@pytest.mark.parametrize("root", ["/proc", "/sys"])
def test_a_target_that_cannot_be_written_is_one_error_line(gym_home, capsys, root):
    """It was atomic_dir's PermissionError traceback."""
    from flows.cli import main
    from tests.test_export import _unwritable

    target = _unwritable(root)
    assert main(["deploy", "--model", "gym-tiny", "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: can't write {target}: no folder can be made in {root} (")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_stages_adapter_deploys_under_the_stages_name(gym_home, tmp_path):
    """The Space of `<stage>/adapter` was titled "Chat with adapter", its card `# adapter`."""
    from gym import train
    from gym.train import TrainConfig
    from tests.helpers import tiny, tokenized

    config = TrainConfig(method="sft", finetuning_type="lora", max_steps=2, logging_steps=1)
    stage = Path(train.run(config, tiny(), tokenized("demo_sft", tiny(), max_samples=16)).stage_dir)
    plan = DeployPlan(model_repo=None, space_repo=None)
    bundle = build(str(stage / "adapter"), tmp_path / "bundle", plan, space=True)
    assert f"\n# {stage.name}\n" in (bundle / "model" / "README.md").read_text()
    assert json.dumps(f"Chat with {stage.name}") in (bundle / "space" / "app.py").read_text()
    assert f"\n# {stage.name}\n" in (bundle / "space" / "README.md").read_text()
