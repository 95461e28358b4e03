"""Data tasks: ingest a dataset into an Arrow artifact; template and tokenize it for a model.

Ingest may read a hub dataset: it is retried with backoff on transient errors (not on bad data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.data.ingest import load_meta
from gym.data.mix import ingest_named, source_stamp
from gym.data.split import split
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.models import ModelRef
from tasks._common import DATA_TIMEOUT_S, IO_RETRIES, gym_task
from tasks.tracking import artifact_key, publish, table


@gym_task(
    name="ingest-dataset",
    task_run_name="ingest {name}",
    identity=source_stamp,
    timeout_seconds=DATA_TIMEOUT_S,
    **IO_RETRIES,
)
def ingest_dataset(name: str) -> Any:
    """Read, validate and normalize a dataset (registry name, path or hub id, or a comma-separated list of
    them: their records one after the other) into an artifact."""
    result = ingest_named(name)
    publish(
        f"ingest-{artifact_key(name)}",  # one key per dataset: the Artifacts page keeps a key's latest
        f"## ingest {name}\n\n"
        + table(
            {"records": result.num_records, "kind": result.kind, "digest": result.digest, "path": result.path}
        ),
        f"Dataset {name} as gym read it",
    )
    return result


@gym_task(name="split-dataset", task_run_name="hold out {val_size} of {name}")
def split_dataset(
    dataset: Any, val_size: float, seed: int, name: str, max_samples: int | None = None
) -> tuple[Any, Any]:
    """(train, held-out) parts of ingested dataset `name`: `val_size` of its records (of the first
    `max_samples` of each dataset, when set) held out at random."""
    train, held = split(dataset, val_size, seed, name, max_samples)
    counts = {"train records": train.num_records, "held-out records": held.num_records, "of": dataset.digest}
    publish(
        f"split-{artifact_key(name)}",
        f"## hold out {val_size}\n\n" + table(counts),
        f"Held-out part of dataset {dataset.digest}",
    )
    return train, held


def tokenize_run_name() -> str:
    """What a user recognises in the UI's task list (the digest alone named nothing): the records, as many
    as max_samples lets through, the model and the digest."""
    from prefect.runtime import task_run

    params = task_run.parameters
    dataset, model, settings = params["dataset"], params["model"], params["settings"]
    n, cap = dataset.num_records, settings.max_samples
    kind = f"{dataset.kind} records as prompts" if params.get("as_prompts") and dataset.kind == "sft" else ""
    kind = kind or f"{dataset.kind} records"
    if cap is None or cap >= n:
        records = f"{n} {kind}"
    elif "mix_of" in load_meta(dataset.path):  # max_samples caps each dataset of a mix
        records = f"up to {cap} of each dataset's {kind} ({n} in all)"
    else:
        records = f"{cap} of {n} {kind}"
    return f"tokenize {records} for {model.name} ({dataset.digest})"


@gym_task(
    name="tokenize-dataset",
    task_run_name=tokenize_run_name,
    timeout_seconds=DATA_TIMEOUT_S,
)
def tokenize_dataset(
    dataset: Any, model: ModelRef, settings: TokenizeSettings, as_prompts: bool = False
) -> Any:
    """Render with the model's chat template, tokenize and mask labels into an artifact (sft records as
    prompts with `as_prompts`: online RL's data)."""
    path, template = Path(dataset.path), model.template
    return tokenize(
        path,
        model.path,
        template,
        settings,
        revision=model.revision,
        as_prompts=as_prompts,
        trust_remote_code=model.trust_remote_code,
    )
