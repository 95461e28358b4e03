"""`gym tfgrpo`: Training-Free GRPO tools that need no Prefect.

    gym tfgrpo simulate [--seed 0] [--run-dir DIR] [--json]     the seeded simulated environment
    gym tfgrpo show LIBRARY.json|FOLDER [--json]                 a library, as the prompt shows it

Training itself runs as a flow: `gym train --method tf_grpo ...`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gym.cli_options import ArgumentParser


def cmd_tfgrpo(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="gym tfgrpo", description="Training-Free GRPO tools.")
    sub = parser.add_subparsers(dest="action", required=True)
    sim = sub.add_parser("simulate", help="Run the seeded simulated environment (and its ablations).")
    sim.add_argument("--seed", type=int, default=0, help="Seed of the environment and of the run.")
    sim.add_argument("--run-dir", default=None, help="Keep the runs here (default: a temporary folder).")
    sim.add_argument("--json", action="store_true", help="End with one line of JSON.")
    show = sub.add_parser("show", help="Print an experience library (its file, or a folder holding it).")
    show.add_argument(
        "library",
        help="A library JSON file (experiences.json, libraries/v*.json), or a folder holding one: a model "
        "or export (experiences.json), a run directory (library.json).",
    )
    show.add_argument("--json", action="store_true", help="Print the file's JSON.")
    args = parser.parse_args(argv)
    if args.action == "simulate":
        from gym.tfgrpo.sim import simulate

        report = simulate(seed=args.seed, root=Path(args.run_dir) if args.run_dir else None)
        curve = " -> ".join(f"{m:.3f}" for m in report.mean_at_k)
        print(f"held-out Mean@{report.k} before and after each epoch: {curve}")
        print(f"held-out Pass@{report.k}: {' -> '.join(f'{p:.3f}' for p in report.pass_at_k)}")
        print(f"ablations (final Mean@k): G=1 {report.ablations['g1']:.3f}, "
              f"no ground truth {report.ablations['no_ground_truth']:.3f}")  # fmt: skip
        print(f"library: {report.library_size} experiences ({report.merges} merges)")
        for text in report.library:
            print(f"  - {text}")
        if args.json:
            print(json.dumps(report.model_dump(mode="json"), sort_keys=True))
        return 0
    from gym.errors import DataError
    from gym.tfgrpo.injection import EXPERIENCE_FILE, experience_block, shipped_library
    from gym.tfgrpo.library import Library

    file = library_file(Path(args.library))
    try:
        library = Library.load(file)
    except DataError as exc:
        shipped = shipped_library(file.parent) if file.name == EXPERIENCE_FILE and not args.json else None
        if shipped is None or not shipped.texts:  # nothing serving would inject: the file is malformed
            raise
        # a model's experiences.json edited by hand (or written in the short form): serving injects it as
        # it reads it, so show that, saying why the library check failed
        print(f"note: {exc}; shown as gym serve, chat and eval inject it", file=sys.stderr)
        print(experience_block(shipped.texts))
        return 0
    if not args.json and not library.items:  # the header alone read as a library with nothing shown
        print(f"{file}: the experience library is empty (version {library.version}): nothing to inject")
        return 0
    print(library.to_json() if args.json else experience_block(library.texts), end="" if args.json else "\n")
    return 0


def library_file(path: Path) -> Path:
    """The library file `path` names: itself, or for a folder the library it holds: a model's, an
    export's or an experience_lib_path's experiences.json, else a run directory's library.json."""
    if not path.is_dir():
        return path  # a file, or nothing there: Library.load says so
    from gym.errors import DataError
    from gym.tfgrpo.injection import EXPERIENCE_FILE

    names = (EXPERIENCE_FILE, "library.json")
    found = next((path / name for name in names if (path / name).is_file()), None)
    if found is None:
        raise DataError(
            f"this folder holds no experience library ({' or '.join(names)})",
            file=str(path),
            hint="give a TF-GRPO model or export folder, a run directory, or the library file itself",
        )
    return found
