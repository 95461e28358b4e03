"""Hold out part of an ingested dataset: `val_size` as in LLaMA-Factory (a share below 1, a count from 1).

    from gym.data.split import split
    train, held_out = split(ingest(resolve_dataset("mine.jsonl")), val_size=0.1, seed=42)

The held-out records are drawn at random with `seed` (`datasets.Dataset.train_test_split`); both
parts are ingested datasets of their own (a folder with meta.json under the workspace's
datasets/, named by the parent's digest, `val_size` and `seed`), so they tokenize, cache and
train like any other. A split that would leave either part empty is refused, naming the counts.
"""

from __future__ import annotations

from gym import workspace
from gym.data.ingest import IngestResult, load_meta
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
    count = round(val_size * records) if val_size < 1 else int(val_size)
    if count < 1 or count >= records:
        raise ConfigError(
            f"val_size: {val_size:g} of the {records} records of {name} holds out {count}, leaving "
            f"{records - count} to train on; both parts need at least one record (give a share such as "
            "0.1, or a number of records below the dataset's size)"
        )
    return count


def split(
    data: IngestResult, val_size: float, seed: int, name: str = "the dataset"
) -> tuple[IngestResult, IngestResult]:
    """(train, held-out) parts of `data` (dataset `name`, for messages); each written once, atomically."""
    import datasets

    count = held_out_count(val_size, data.num_records, name)
    digests = {
        part: hash_obj({"of": data.digest, "val_size": val_size, "seed": seed, "part": part})
        for part in PARTS
    }
    finals = {part: workspace.path("datasets", digest) for part, digest in digests.items()}
    if not all((final / "meta.json").is_file() for final in finals.values()):
        parent = load_meta(data.path)
        parts = datasets.load_from_disk(str(data.path)).train_test_split(test_size=count, seed=seed)
        for part, rows in zip(PARTS, (parts["train"], parts["test"]), strict=True):
            meta = {
                **{k: parent[k] for k in ("kind", "format")},
                "digest": digests[part],
                "num_records": len(rows),  # train_test_split keeps `count` rows in "test"
                "split_of": {"digest": data.digest, "val_size": val_size, "seed": seed, "part": part},
            }
            with workspace.atomic_dir(finals[part]) as tmp:
                rows.save_to_disk(str(tmp))
                workspace.atomic_write_json(tmp / "meta.json", meta)
    counts = {"train": data.num_records - count, "held_out": count}
    train, held = (
        IngestResult(path=finals[p], digest=digests[p], kind=data.kind, num_records=counts[p]) for p in PARTS
    )
    return train, held
