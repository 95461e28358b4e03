"""Hold out part of an ingested dataset: `val_size` as in LLaMA-Factory (a share below 1, a count from 1).

    from gym.data.split import split
    train, held_out = split(ingest(resolve_dataset("mine.jsonl")), val_size=0.1, seed=42)

The held-out records are drawn at random with `seed` (`datasets.Dataset.train_test_split`); both
parts are ingested datasets of their own (a folder with meta.json under the workspace's
datasets/, named by the parent's digest, `val_size` and `seed`), so they tokenize, cache and
train like any other. A split that would leave either part empty is refused, naming the counts.
A share is rounded up, as datasets' `train_test_split` and LLaMA-Factory do; with `max_samples`, the
first N records of each dataset are kept before the split, as LLaMA-Factory does.
The train part of a mix of datasets (gym.data.mix) keeps its records in their datasets, in order,
with each dataset's count, so that a stage can still cap or interleave them per dataset.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from gym import workspace
from gym.data.ingest import IngestResult, load_meta, load_saved
from gym.errors import ConfigError
from gym.hashing import hash_obj

PARTS = ("train", "held_out")


def held_out_count(val_size: float, records: int, name: str) -> int:
    """How many of `records` a `val_size` holds out; a ConfigError naming dataset `name` when a part would
    be empty."""
    if val_size <= 0 or (val_size >= 1 and val_size != int(val_size)):
        raise ConfigError(
            f"val_size: {val_size:g} is neither a share in (0, 1) nor a whole number of records"
        )
    # as datasets' train_test_split (and so LLaMA-Factory) counts a share: rounded up
    count = math.ceil(val_size * records) if val_size < 1 else int(val_size)
    if count >= records:
        if records < 2:
            fix = "add records: both parts need at least one"
        else:
            share = "a smaller fraction" if val_size < 1 else "a fraction"
            fix = f"use {share} (e.g. 0.1) or at most {records - 1} records, or add data"
        held = f" (holding out {count}, rounded up)" if val_size < 1 else ""
        raise ConfigError(
            f"val_size: {name} has only {records} record{'s' if records != 1 else ''}, so val_size "
            f"{val_size:g}{held} leaves nothing to train on; {fix}"
        )
    return count


def split(
    data: IngestResult, val_size: float, seed: int, name: str = "the dataset", max_samples: int | None = None
) -> tuple[IngestResult, IngestResult]:
    """(train, held-out) parts of `data` (dataset `name`, for messages); each written once, atomically.
    `max_samples` (the tokenize setting) first keeps the first N records of each dataset, as
    LLaMA-Factory caps them before it holds `val_size` out: the held-out part is drawn from those, and
    `val_size`'s share is of their count."""
    import datasets

    from gym.data.tokenize import first_records

    parent = load_meta(data.path, "ingested")
    pool = first_records(parent, max_samples, data.num_records) if max_samples else range(data.num_records)
    count = held_out_count(val_size, len(pool), name)
    mixed = "mix_of" in parent
    digests = {
        part: hash_obj(
            {"of": data.digest, "val_size": val_size, "seed": seed, "part": part, "held_out": count}
            | ({"parts_kept": True} if mixed else {})
            | ({"max_samples": max_samples} if max_samples else {})
        )
        for part in PARTS
    }
    finals = {part: workspace.path("datasets", digest) for part, digest in digests.items()}
    if not all((final / "meta.json").is_file() for final in finals.values()):
        rows = load_saved(data.path)
        extra: dict[str, dict[str, Any]] = {"train": {}, "held_out": {}}
        if mixed:  # the train records stay in their datasets, in order (train_test_split shuffles them)
            drawn = datasets.Dataset.from_dict({"i": list(pool)}).train_test_split(test_size=count, seed=seed)
            kept = sorted(drawn["train"]["i"])
            parts = {"train": rows.select(kept), "test": rows.select(drawn["test"]["i"])}
            extra["train"] = {"mix_of": _kept_per_part(parent["mix_of"], kept)}
        else:
            capped = rows.select(pool) if max_samples else rows
            parts = capped.train_test_split(test_size=count, seed=seed)
        for part, rows_ in zip(PARTS, (parts["train"], parts["test"]), strict=True):
            meta = {
                **{k: parent[k] for k in ("kind", "format")},
                "digest": digests[part],
                "num_records": len(rows_),  # train_test_split keeps `count` rows in "test"
                "split_of": {"digest": data.digest, "val_size": val_size, "seed": seed, "part": part}
                | ({"max_samples": max_samples} if max_samples else {}),
                **extra[part],
            }
            with workspace.atomic_dir(finals[part]) as tmp:
                rows_.save_to_disk(str(tmp))
                workspace.atomic_write_json(tmp / "meta.json", meta)
    counts = {"train": len(pool) - count, "held_out": count}
    train, held = (
        IngestResult(path=finals[p], digest=digests[p], kind=data.kind, num_records=counts[p]) for p in PARTS
    )
    return train, held


def _kept_per_part(mix_of: list[dict[str, Any]], kept: list[int]) -> list[dict[str, Any]]:
    """The mix's parts (gym.data.mix's `mix_of`) with the number of their records in `kept` (sorted
    indices)."""
    out, start = [], 0
    for part in mix_of:
        end = start + part["num_records"]
        out.append({**part, "num_records": bisect.bisect_left(kept, end) - bisect.bisect_left(kept, start)})
        start = end
    return out
