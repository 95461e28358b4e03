"""`gym deploy`: put a model where people can use it: a hub model repo, plus a Space that chats with it.

    gym deploy --model M --target DIR                      # offline: write what would be pushed
    gym deploy --model M --target OWNER/NAME --push_to_hub [--hf-token-env HF_TOKEN]
    gym deploy --model_path ./output/qwen3-lora --hf_token $HF_TOKEN --push_to_hub     # the papers' form

M is anything `gym export` takes (a LoRA output folder is merged into its base). The bundle is
`model/` (the hub-style export: weights, tokenizer, card), `space/` (a Gradio chat Space: app.py,
requirements.txt, README.md; `--no-space` leaves it out) and `deploy.json` (which repo each folder
goes to). Without --push_to_hub the bundle is written to the target directory and nothing leaves
the machine; with it, the bundle is built in the workspace and each folder is uploaded with
huggingface_hub. The token comes from --hf_token, else the variable --hf-token-env names
(default HF_TOKEN); it is never printed or written anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gym import workspace
from gym.cli_options import ArgumentParser
from gym.errors import ConfigError, GymError
from gym.export import DEPLOY_PLAN, export_model, locate, model_name, replace_dir
from gym.hashing import hash_obj
from gym.space import write_space
from gym.tfgrpo.injection import load_shipped

PLAN = DEPLOY_PLAN
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class DeployPlan(BaseModel):
    """Where each folder of a bundle goes."""

    model_repo: str | None = Field(description="Hub model repo for model/ (None: decided when pushing).")
    space_repo: str | None = Field(description="Hub Space for space/ (None: no Space).")
    private: bool = Field(False, description="Create the repos private.")


def build(model: str, out: Path, plan: DeployPlan, space: bool, base: str | None = None) -> Path:
    """Write the bundle (model/, space/, deploy.json) to `out`, staged and renamed into place."""
    name = _model_name(model)
    with replace_dir(out, lambda folder: (folder / PLAN).is_file()) as tmp:
        exported = export_model(model, tmp / "model", base=base)
        if space:
            # On the Space the app loads the model repo; run locally it loads ../model.
            model_id = plan.model_repo or "../model"
            write_space(tmp / "space", name, model_id, load_shipped(exported), plan.model_repo)
        workspace.atomic_write_json(tmp / PLAN, plan.model_dump())
    return out.expanduser().resolve()


def push(bundle: Path, plan: DeployPlan, api: Any) -> dict[str, str]:
    """Upload model/ (and space/) to the plan's repos with `api` (a huggingface_hub.HfApi); returns URLs."""
    if plan.model_repo is None:
        raise ConfigError("no model repo to push to: pass --target OWNER/NAME")
    urls: dict[str, str] = {}
    api.create_repo(plan.model_repo, repo_type="model", private=plan.private, exist_ok=True)
    api.upload_folder(
        repo_id=plan.model_repo, folder_path=str(bundle / "model"), commit_message="gym deploy: model"
    )
    urls["model"] = f"https://huggingface.co/{plan.model_repo}"
    if plan.space_repo and (bundle / "space").is_dir():
        api.create_repo(
            plan.space_repo, repo_type="space", space_sdk="gradio", private=plan.private, exist_ok=True
        )
        space = str(bundle / "space")
        api.upload_folder(
            repo_id=plan.space_repo,
            folder_path=space,
            repo_type="space",
            commit_message="gym deploy: chat Space",
        )
        urls["space"] = f"https://huggingface.co/spaces/{plan.space_repo}"
    return urls


def _model_name(model: str) -> str:
    """The name of the Space's title and of the default repo: as the export's card has it (a stage's
    adapter/ or model/ folder: the stage's), the last part of a hub id."""
    tail = model_name(model).rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^\w.-]+", "-", tail) or "model"


def _token(value: str | None, env_var: str) -> str | None:
    return value or os.environ.get(env_var) or None


def cmd_deploy(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="gym deploy", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        "--model_path",
        dest="model",
        required=True,
        help="Model/adapter directory, registry name or URI.",
    )
    parser.add_argument(
        "--target", help="Directory to write, or with --push_to_hub the model repo OWNER/NAME."
    )
    parser.add_argument("--push_to_hub", "--push-to-hub", action="store_true", help="Upload to the hub.")
    parser.add_argument("--hf_token", "--hf-token", default=None, help="Hub token (prefer --hf-token-env).")
    parser.add_argument("--hf-token-env", default="HF_TOKEN", help="Variable holding the hub token.")
    parser.add_argument(
        "--space", action=argparse.BooleanOptionalAction, default=True, help="Also write a Gradio chat Space."
    )
    parser.add_argument("--space-repo", default=None, help="Space repo (default: <model repo>-chat).")
    parser.add_argument("--private", action="store_true", help="Create private repos.")
    parser.add_argument(
        "--base", default=None, help="Base model of an adapter (default: its adapter_config)."
    )
    args = parser.parse_args(argv)

    if not args.push_to_hub:
        if not args.target:
            raise ConfigError("--target DIR is needed without --push_to_hub (where to write the bundle)")
        if args.hf_token:  # the papers' form without --push_to_hub: nothing reads it (nor writes it anywhere)
            note = "gym deploy: note: --hf_token is read with --push_to_hub only; nothing is pushed"
            print(note, file=sys.stderr)
        plan = DeployPlan(model_repo=None, space_repo=None, private=args.private)
        out = build(args.model, Path(args.target), plan, args.space, args.base)
        print(
            f"wrote the deploy bundle to {out} (model/{', space/' if args.space else ''}); nothing was pushed"
        )
        return 0
    return _push(args)


def _push(args: argparse.Namespace) -> int:
    from huggingface_hub import HfApi, constants

    locate(args.model, args.base)  # a model that isn't there is the first thing to fix, before token or hub
    token = _token(args.hf_token, args.hf_token_env)
    if token is None:
        raise ConfigError(f"--push_to_hub needs a token: --hf_token or ${args.hf_token_env}")
    if constants.HF_HUB_OFFLINE:
        raise ConfigError("--push_to_hub while HF_HUB_OFFLINE=1: unset it, or deploy to a --target DIR")
    api = HfApi(token=token)
    try:
        repo = args.target or f"{api.whoami()['name']}/{_model_name(args.model)}"
        if not REPO_ID.match(repo):
            raise ConfigError(f"--target {repo!r} is not a hub repo id (OWNER/NAME)")
        space = (args.space_repo or f"{repo}-chat") if args.space else None
        plan = DeployPlan(model_repo=repo, space_repo=space, private=args.private)
        staging = workspace.path("runs", f"deploy-{hash_obj(plan.model_dump())}")
        bundle = build(args.model, staging, plan, args.space, args.base)
        urls = push(bundle, plan, api)
    except GymError:
        raise
    except Exception as exc:  # the hub's errors, stated without the token
        raise GymError(
            f"push to the hub failed: {type(exc).__name__}: {str(exc).replace(token, '***')}"
        ) from exc
    print(json.dumps({"bundle": str(bundle), **urls}))
    return 0
