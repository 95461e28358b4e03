"""MMLU / CMMLU named by hub id (`cais/mmlu`, `haonan-li/cmmlu`) load offline from the hub cache.

No network here, so the download itself cannot run; what can run is the same call gym makes
(`huggingface_hub.snapshot_download` of the dataset repo) resolving a copy a download left in the hub
cache (`datasets--<owner>--<name>/refs/main` -> `snapshots/<commit>/...`), laid out as the hub repos
are: cais/mmlu as `<subject>/<split>-00000-of-00001.parquet` (question, subject, choices, answer),
haonan-li/cmmlu as its release zip. Each runs in a subprocess, because the hub cache location is
read from the environment when huggingface_hub is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gym.eval.mc_data import load_benchmark
from tests.eval_fixtures import SUBJECTS, write_benchmark
from tests.helpers import hub_snapshot

REPO = Path(__file__).resolve().parents[1]


def offline_load(cache: Path, benchmark: str) -> list[list[dict]]:
    # The thread count: reading parquet must start none of Arrow's threads, which now and then
    # aborted this process at exit after it had printed everything (exit -6, apache/arrow#34314).
    script = (
        "import json, os, sys\nimport pyarrow.parquet\nfrom gym.eval.mc_data import load_benchmark\n"
        "threads = lambda: len(os.listdir('/proc/self/task'))\nbefore = threads()\n"
        f"data = load_benchmark({benchmark!r}, subjects={list(SUBJECTS[benchmark])!r})\n"
        "print('new threads:', threads() - before)\n"
        "print(json.dumps([[q.__dict__ for q in s.questions] for s in data.subjects], default=list))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=cache, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    *_, threads, questions = proc.stdout.strip().splitlines()
    assert threads == "new threads: 0"
    return json.loads(questions)


def as_json(benchmark: str, path: Path) -> list[list[dict]]:
    data = load_benchmark(benchmark, path, subjects=list(SUBJECTS[benchmark]))
    return json.loads(json.dumps([[q.__dict__ for q in s.questions] for s in data.subjects], default=list))


def test_hub_ids_resolve_to_the_hub_cache_offline(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cache = tmp_path / "hub-cache"
    original = load_benchmark("mmlu", write_benchmark("mmlu", tmp_path / "mmlu"), subjects=SUBJECTS["mmlu"])
    snapshot = hub_snapshot(cache, "cais/mmlu", "datasets")
    for subject in original.subjects:
        key = subject.info.key
        for split, rows in (("dev", subject.pool), ("test", subject.questions)):
            records = [
                {"question": q.question, "subject": key, "choices": list(q.choices), "answer": q.answer}
                for q in rows
            ]
            (snapshot / key).mkdir(exist_ok=True)
            pq.write_table(pa.Table.from_pylist(records), snapshot / key / f"{split}-00000-of-00001.parquet")
    assert offline_load(cache, "mmlu") == as_json("mmlu", tmp_path / "mmlu")

    release = write_benchmark("cmmlu", tmp_path / "cmmlu", as_zip=True)
    snapshot = hub_snapshot(cache, "haonan-li/cmmlu", "datasets")
    (snapshot / "cmmlu_v1_0_1.zip").write_bytes(release.read_bytes())
    assert offline_load(cache, "cmmlu") == as_json("cmmlu", release)
