"""MLflow registry hand-off: lineage tags and card on every version, no duplicate versions for the same
content, and a champion alias that moves only when the challenger wins by the margin."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from gym import tracking
from gym.errors import ConfigError
from gym.lineage import LINEAGE_TAG, Lineage, describe
from gym.models import load_model, resolve
from gym.promotion import promote
from gym.registration import register
from tests.serve_fixtures import noisy_tiny


def facts(score: float, **more: float) -> Lineage:
    return Lineage(
        base_model="gym-tiny", template="chatml", method="sft", scores={"exact_match_after": score, **more}
    )


def register_dir(model_dir: Path, name: str, lineage: Lineage) -> str:
    run_id = tracking.start_run("register")
    return register(model_dir, name, lineage, run_id).version


class Variants:
    """Distinct models (gym-tiny with seeded noise), built when first asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __getitem__(self, i: int) -> Path:
        path = self.root / f"v{i}"
        return path if path.is_dir() else noisy_tiny(path, seed=i)


@pytest.fixture()
def variants(tmp_path: Path) -> Variants:
    return Variants(tmp_path)


def test_a_registration_carries_lineage_and_card_and_same_content_reuses_its_version(gym_home, variants):
    config = {"dataset": "demo_sft", "train": {"method": "sft", "learning_rate": 0.003, "hub_token": "hf_x"}}
    lineage = describe(
        "gym-tiny", "chatml", {"dataset": "d" * 16, "sft_stage": "s" * 16}, config, flow_run_id="flow-1"
    )
    run_id = tracking.start_run("register")
    first = register(variants[0], "tiny-reg", lineage, run_id)
    assert (first.version, first.reused) == ("1", False)

    client = MlflowClient(tracking.tracking_uri())
    mv = client.get_model_version("tiny-reg", "1")
    tags = mv.tags
    assert tags["dataset"] == "d" * 16 and tags["sft_stage"] == "s" * 16
    assert tags["base_model"] == "gym-tiny" and tags["registry_entry"] == "gym-tiny"
    assert len(tags["registry_digest"]) == 16 and len(tags["config_digest"]) == 16
    assert tags["gym_version"] and tags["prefect_flow_run_id"] == "flow-1" and tags["template"] == "chatml"
    assert Lineage.from_tags(tags) == lineage
    assert "hf_x" not in tags[LINEAGE_TAG]  # secrets in the config are redacted
    card = mv.description
    assert card.startswith("---\n") and "| base model | `gym-tiny` |" in card and "demo_sft" in card
    assert "d" * 16 in card and "learning_rate" in card

    again = register(variants[0], "tiny-reg", lineage.model_copy(update={"flow_run_id": "flow-2"}), run_id)
    assert (again.version, again.reused) == ("1", True)
    assert client.get_model_version("tiny-reg", "1").tags["gym.last_registered_by"] == "flow-2"
    other = register(variants[1], "tiny-reg", lineage, run_id, alias="challenger")
    assert (other.version, other.reused) == ("2", False)
    assert str(client.get_model_version_by_alias("tiny-reg", "challenger").version) == "2"
    back = register(variants[0], "tiny-reg", lineage, run_id)
    assert (back.version, back.reused) == ("1", True)
    assert str(client.get_model_version_by_alias("tiny-reg", "challenger").version) == "1"


QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize(
    ("base", "metadata", "row"),
    [
        # a registry model: the Hub's metadata names its hub id (the Hub refuses a push whose base_model
        # is no model there), the card's table both
        ("qwen2.5-0.5b-instruct", QWEN, f"`qwen2.5-0.5b-instruct` (hub: `{QWEN}`)"),
        (QWEN, QWEN, f"`{QWEN}`"),
        ("some-org/not-in-the-registry", "some-org/not-in-the-registry", "`some-org/not-in-the-registry`"),
        ("gym-tiny", None, "`gym-tiny`"),  # gym builds it: on no hub
        ("/models/my-base", None, "`/models/my-base`"),  # a folder
    ],
)  # fmt: skip
def test_the_cards_base_model_metadata_is_a_hub_id_or_left_out(base, metadata, row):
    from gym.card import render

    card = render("m", Lineage(base_model=base))
    front = card.split("\n---\n", 1)[0]
    assert (f"base_model: {json.dumps(metadata)}" in front) if metadata else "base_model" not in front
    assert f"| base model | {row} |" in card


def test_champion_moves_only_when_the_challenger_wins_by_the_margin(gym_home, variants):
    name = "tiny-promo"
    register_dir(variants[0], name, facts(0.50, sft_loss_last=1.0))
    first = promote(name, "exact_match_after", margin=0.05)
    assert first.promoted and first.champion == "1" and "no champion yet" in first.reason

    register_dir(variants[1], name, facts(0.53, sft_loss_last=0.8))
    close = promote(name, "exact_match_after", margin=0.05)
    assert not close.promoted and close.champion == "1" and "0.5300 vs 0.5000" in close.reason
    tags = MlflowClient(tracking.tracking_uri()).get_model_version(name, "2").tags
    assert tags["promotion.decision"] == "kept" and tags["promotion.compared_with"] == "1"
    assert tags["promotion.reason"] == close.reason
    assert "| champion now | v1 | 0.5000 |" in close.markdown()  # kept: the champion's own score

    by_loss = promote(name, "sft_loss_last", margin=0.1, mode="min")  # 0.8 beats 1.0 by 0.2
    assert by_loss.promoted and by_loss.champion == "2" and by_loss.previous_champion == "1"
    assert "| champion now | v2 | 0.8000 |" in by_loss.markdown()  # promoted: the challenger's
    with pytest.raises(ConfigError, match="available: exact_match_after, sft_loss_last"):
        promote(name, "dpo_reward_accuracy")  # neither version has it

    register_dir(variants[2], name, facts(0.80))
    lacking = promote(name, "sft_loss_last", mode="min")  # only the champion has it
    assert not lacking.promoted and "has no 'sft_loss_last' score" in lacking.reason
    best = promote(name, "exact_match_after", margin=0.05)
    assert best.promoted and best.champion == "3" and "## Promotion" in best.markdown()
    assert promote(name, "exact_match_after").reason == "v3 is already the champion"
    tags = MlflowClient(tracking.tracking_uri()).get_model_version(name, "3").tags  # the record of why stays
    assert tags["promotion.decision"] == "promoted" and tags["promotion.reason"] == best.reason

    # The champion is exactly the model that was evaluated: same logits after the registry round trip.
    champion = resolve(f"models:/{name}@champion")
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        evaluated = load_model(resolve(str(variants[2]), template="chatml"))(ids).logits
        assert torch.equal(load_model(champion)(ids).logits, evaluated)

    with pytest.raises(ConfigError, match="register one first"):
        promote("no-such-model", "exact_match_after")


def test_a_loss_wins_by_being_lower_and_the_version_judged_is_the_alias_named(gym_home, variants, capsys):
    """The default mode was max for every metric: a worse loss was promoted. A flow registering under
    another alias had the version `challenger` pointed to judged, not the one it registered."""
    from flows.cli import main

    name = "tiny-loss"
    register_dir(variants[0], name, facts(0.5, sft_loss_last=1.0))
    assert promote(name, "sft_loss_last").promoted
    register_dir(variants[1], name, facts(0.9, sft_loss_last=2.0))  # worse loss, now challenger
    worse = promote(name, "sft_loss_last")
    assert not worse.promoted and worse.mode == "min" and "lower is better" in worse.markdown()
    assert promote(name, "exact_match_after").mode == "max"

    run_id = tracking.start_run("register")
    assert (
        register(variants[2], name, facts(0.1, sft_loss_last=0.5), run_id, alias="candidate").version == "3"
    )
    assert not promote(name, "sft_loss_last").promoted, "challenger still points to v2"
    argv = ["promote", "--name", name, "--metric", "sft_loss_last", "--challenger", "candidate", "--json"]
    assert main(argv) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["promoted"] and decision["champion"] == "3" and decision["challenger"] == "3"


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ({"alias": "champion"}, "output.alias 'champion': the champion moves only when a version wins"),
        ({"alias": "latest"}, "output.alias 'latest': 'latest' alias name (case insensitive) is reserved"),
        ({"alias": "v7"}, "output.alias 'v7': Version alias name 'v7' is reserved"),
        ({"alias": "new model"}, "output.alias 'new model': Invalid alias name"),
        ({"register_as": "team/model:1"}, "output.register_as 'team/model:1': Invalid model name"),
    ],
)
def test_a_name_or_alias_mlflow_refuses_stops_the_flow_before_any_work(gym_home, output, says):
    """Each failed the flow after training, leaving a version without its alias (champion skipped the
    promotion gate)."""
    from gym import preflight
    from gym.pipeline import OutputSettings, TrainFlowConfig

    with pytest.raises(ConfigError, match=re.escape(says)):
        preflight.check(TrainFlowConfig(output=OutputSettings(**output)))
    preflight.check(TrainFlowConfig(output=OutputSettings(register_as="team-model_1", alias="candidate")))


@pytest.mark.parametrize("experiment", ["", "  "])
def test_an_empty_experiment_name_is_refused_not_replaced_by_gym(experiment, capsys):
    """`--output.experiment ''` trained and logged to the experiment `gym`, without a word."""
    from flows.cli import main

    assert main(["train", "--max-steps", "1", "--output.experiment", experiment]) == 2
    said = "must not be empty" if experiment == "" else "must not be blank"  # not pydantic's words
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: output.experiment: {said}")


def test_gym_promote_command_prints_the_decision(gym_home, capsys):
    from flows.cli import main

    register_dir(Path(resolve("gym-tiny").path), "tiny-cli", facts(0.4))
    assert main(["promote", "--name", "tiny-cli", "--metric", "exact_match_after", "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["promoted"] and decision["champion"] == "1"
    for margin in ("-1", "nan", "inf"):  # NaN beat nothing and printed invalid JSON (NaN, Infinity)
        assert (
            main(["promote", "--name", "tiny-cli", "--metric", "exact_match_after", "--margin", margin]) == 2
        )
        assert "--margin must be a finite number >= 0" in capsys.readouterr().err
    # --model, as every other command names the model (gym export/serve/chat/eval).
    assert main(["promote", "--model", "tiny-cli", "--metric", "exact_match_after", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "v1 is already the champion"


def test_a_registration_interrupted_after_its_version_is_completed_by_the_next(
    gym_home, variants, monkeypatch
):
    """Ctrl-C (or a kill) once the version exists: the next registration of the same content reuses it,
    with its content tag (written with the version), and adds the card and alias it lacked."""
    lineage = facts(0.5)
    first_alias = MlflowClient.set_registered_model_alias

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", interrupted)
    with pytest.raises(KeyboardInterrupt):
        register_dir(variants[0], "tiny-int", lineage)
    client = MlflowClient(tracking.tracking_uri())
    left = client.get_model_version("tiny-int", "1")
    assert left.tags["content_digest"] and not left.description and not left.aliases
    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", first_alias)
    again = register(variants[0], "tiny-int", lineage, tracking.start_run("register"))
    assert (again.version, again.reused) == ("1", True)
    mv = client.get_model_version("tiny-int", "1")
    assert mv.description.startswith("---\n") and mv.aliases == ["challenger"]
    assert len(client.search_model_versions("name = 'tiny-int'")) == 1


def test_two_processes_registering_the_same_content_at_once_make_one_version(gym_home, variants):
    """Two runs of one flow side by side: each looked the content up, found nothing, and added a version."""
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path; from gym import tracking; from gym.lineage import Lineage\n"
        "from gym.registration import register\n"
        "facts = Lineage(base_model='gym-tiny', template='chatml', method='sft')\n"
        "r = register(Path(sys.argv[1]), 'tiny-two', facts, tracking.start_run('register'))\n"
        "print(r.version, r.reused)\n"
    )
    model = variants[0]
    tracking.start_run("create the store first")  # as a flow does before it registers
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(model)], stdout=subprocess.PIPE) for _ in "ab"
    ]
    outs = sorted(p.communicate(timeout=300)[0].decode().split() for p in runs)
    assert all(p.returncode == 0 for p in runs)
    assert outs == [["1", "False"], ["1", "True"]]
    assert len(MlflowClient(tracking.tracking_uri()).search_model_versions("name = 'tiny-two'")) == 1


@pytest.mark.slow
def test_a_training_flow_registers_promotes_and_reuses_its_version_on_rerun(prefect_server, gym_home):
    from prefect.client.orchestration import get_client

    from flows.train import train
    from gym.pipeline import OutputSettings, TrainFlowConfig
    from gym.train import TrainConfig
    from tasks._common import workspace_settings

    config = TrainFlowConfig(
        train=TrainConfig(method="sft", max_steps=3),
        eval_limit=8,
        # Registered under an alias of its own: the flow judges that version (it judged `challenger`).
        output=OutputSettings(register_as="tiny-flow", alias="candidate", promote_metric="exact_match_after"),
    )
    with workspace_settings():
        first = train(config)
        second = train(config)
    assert first["model_version"] == "1" and first["model_reused"] is False
    assert first["promoted"] is True and first["champion_version"] == "1"
    assert second["model_version"] == "1" and second["model_reused"] is True  # nothing new to register
    assert second["promoted"] is False and "already the champion" in second["promotion_reason"]

    tags = MlflowClient(tracking.tracking_uri()).get_model_version("tiny-flow", "1").tags
    assert float(tags["score.exact_match_after"]) == first["exact_match_after"]
    assert tags["method"] == "sft" and tags["prefect_flow_run_id"] == first["flow_run_id"]
    assert json.loads(tags[LINEAGE_TAG])["datasets"]["dataset"]["name"] == "demo_sft"

    # The champion is the model the flow evaluated.
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        evaluated = load_model(resolve(first["model_dir"], template="chatml"))(ids).logits
        assert torch.equal(load_model(resolve("models:/tiny-flow@champion"))(ids).logits, evaluated)

    async def artifacts() -> list:
        async with get_client() as client:
            return await client.read_artifacts()

    import asyncio

    promotion_notes = [a for a in asyncio.run(artifacts()) if a.key == "promotion-tiny-flow"]
    assert promotion_notes and "Promotion of `tiny-flow`" in promotion_notes[0].data


@pytest.mark.parametrize("margin", [float("nan"), float("inf"), -0.1])
def test_a_flows_promote_margin_is_a_finite_number_at_least_0(margin):
    from pydantic import ValidationError

    from gym.pipeline import OutputSettings

    with pytest.raises(ValidationError, match="promote_margin"):
        OutputSettings(promote_margin=margin)
    assert OutputSettings(promote_margin=0.25).promote_margin == 0.25
