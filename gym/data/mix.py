"""Several datasets as one: `--dataset demo_sft,./my_chats.jsonl` (LLaMA-Factory's comma list).

    from gym.data.mix import ingest_named
    data = ingest_named("demo_sft,./my_chats.jsonl")   # one ingested dataset: both, in that order

Each part is ingested on its own (and reused like any ingested dataset); the mix is their records
one after the other, LLaMA-Factory's default `concat` (the trainer shuffles them every epoch),
written once, atomically, under the workspace's datasets/ and named by the parts' digests. The
parts must hold one kind of record (sft, preference, kto or prompt), whatever their source formats:
a mix of kinds fails, naming each part's kind. Every dataset setting of a flow takes a list.

When a stage tokenizes a mix, `--data.mix_strategy` (LLaMA-Factory's `mix_strategy`) can interleave
the parts instead (`interleave`, datasets' `interleave_datasets`): records drawn from the parts in
turn, or at random with `--data.interleave_probs` (one share per part), until the first part runs out
(`interleave_under`) or the last one does, the others starting over (`interleave_over`). The draw
happens after `max_samples` caps each part and after `val_size` holds records out (a held-out split
of a mix keeps its train records in their parts: `gym.data.split`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym import workspace
from gym.data import ingest as ingest_module
from gym.data.ingest import IngestResult, ingest, load_saved
from gym.data.registry import EMPTY_NAME, DatasetSpec, resolve_dataset
from gym.errors import ConfigError
from gym.hashing import hash_obj


def names(value: str) -> list[str]:
    """The datasets a dataset setting names: a comma-separated list, else the one name (an existing
    path with a comma in it is one name)."""
    if not value.strip():
        raise ConfigError(EMPTY_NAME)
    if "," not in value or Path(value).expanduser().exists():
        return [value]
    parts = [part.strip() for part in value.split(",")]
    if not all(parts):
        raise ConfigError(f"dataset list {value!r} has an empty entry: separate dataset names with one comma")
    return parts


def source_stamp(name: str) -> dict[str, Any]:
    """`gym.data.ingest.source_stamp` of each dataset `name` names (for cache keys; never raises)."""
    try:
        parts = names(name)
    except ConfigError as exc:
        return {"unresolved": str(exc)}
    if len(parts) == 1:
        return ingest_module.source_stamp(name)
    return {"mix": [ingest_module.source_stamp(part) for part in parts]}


def check_kinds(kinds: dict[str, str]) -> None:
    """A ConfigError unless the parts of a mix (name -> record kind) hold one kind of record."""
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{part} ({kind})" for part, kind in kinds.items())
        what = "train each kind in its own stage (e.g. sft_then_dpo)"
        if set(kinds.values()) == {"sft", "prompt"}:  # online RL reads either alone as prompts
            what = (
                "online RL reads an sft dataset as prompts on its own, but the parts of a mix are joined "
                "before that: mix sft data with sft data and prompt data with prompt data, or give the sft "
                "part a `prompt` and `answer` (its last answer)"
            )
        raise ConfigError(f"datasets {listed} hold different kinds of records; a mix needs one kind: {what}")


def interleave(
    rows: Any, sizes: list[int], strategy: str, probs: list[float] | None, seed: int, name: str
) -> Any:
    """LLaMA-Factory's `interleave_under` / `interleave_over` of a mix whose parts are the consecutive
    runs of `sizes` records of dataset `rows` (`name`, for messages), drawn with shares `probs` (weights,
    normalised; None: in turn) and `seed`. A part left empty (all its records held out) is left out."""
    import datasets

    if probs is not None and len(probs) != len(sizes):
        raise ConfigError(
            f"interleave_probs gives {len(probs)} share(s) for the {len(sizes)} datasets mixed in {name}: "
            "give one per dataset, in the order the dataset list names them"
        )
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    kept = [i for i, size in enumerate(sizes) if size]
    parts = [rows.select(range(starts[i], starts[i] + sizes[i])) for i in kept]
    shares = None
    if probs is not None:
        weights = [probs[i] for i in kept]
        shares = [w / sum(weights) for w in weights] if sum(weights) > 0 else None
        if shares is None:
            raise ConfigError(f"interleave_probs {probs} leaves no dataset of {name} to draw from")
    until = "first_exhausted" if strategy == "interleave_under" else "all_exhausted"
    return datasets.interleave_datasets(parts, probabilities=shares, seed=seed, stopping_strategy=until)


def ingest_named(value: str, resolve: Callable[[str], DatasetSpec] = resolve_dataset) -> IngestResult:
    """Ingest the dataset, or the mix of datasets, that a dataset setting names (each part read as
    `resolve` finds it)."""
    parts = names(value)
    results = [ingest(resolve(part)) for part in parts]
    return results[0] if len(results) == 1 else mix(results, parts)


def mix(results: list[IngestResult], parts: list[str]) -> IngestResult:
    """The records of ingested datasets `results` (named `parts`, for messages) one after the other."""
    kind = results[0].kind
    check_kinds({part: r.kind for part, r in zip(parts, results, strict=True)})
    digest = hash_obj({"mix": [r.digest for r in results]})
    final = workspace.path("datasets", digest)
    if not (final / "meta.json").is_file():
        import datasets

        rows = datasets.concatenate_datasets([load_saved(r.path) for r in results])
        meta = {
            "digest": digest,
            "kind": kind,
            "format": "mix",
            "num_records": len(rows),
            "mix_of": [
                {"dataset": part, "digest": r.digest, "num_records": r.num_records}
                for part, r in zip(parts, results, strict=True)
            ],
        }
        with workspace.atomic_dir(final) as tmp:
            rows.save_to_disk(str(tmp))
            workspace.atomic_write_json(tmp / "meta.json", meta)
    return IngestResult(path=final, digest=digest, kind=kind, num_records=sum(r.num_records for r in results))
