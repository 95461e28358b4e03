"""lm-eval scores a model served by `gym serve` over HTTP as it scores the model loaded in-process.

lm-eval's `local-completions` model (the way lm-eval evaluates an OpenAI-compatible server) asks
/v1/completions for `logprobs` with `echo` and reads each choice's log-likelihood from them. On
the MMLU fixture (the original layout, lm-eval's own task YAMLs), every question's four
log-likelihoods through gym's server equal lm-eval's `hf` model on the same weights (varied
gym-tiny, whose choice varies with the prompt).
"""

from __future__ import annotations

import numpy as np
import pytest

from gym.eval.mc_data import load_benchmark
from gym.serve.app import build_app
from gym.serve.engine import Engine
from gym.serve.server import serve_in_thread
from tests.eval_fixtures import lm_eval_samples, varied_tiny, write_benchmark

pytest.importorskip("lm_eval")


def test_lm_eval_through_the_api_equals_lm_eval_in_process(gym_home, tmp_path):
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    model = varied_tiny(tmp_path / "varied-tiny")
    data = load_benchmark("mmlu", write_benchmark("mmlu", tmp_path / "mmlu"), shots=2)
    in_process = lm_eval_samples(
        HFLM(pretrained=str(model), batch_size=4, device="cpu"), data, 2, tmp_path / "a"
    )
    with Engine.load(str(model), name="tiny") as engine, serve_in_thread(build_app(engine)) as url:
        served = LocalCompletionsAPI(
            base_url=f"{url}/v1/completions",
            model="tiny",
            tokenizer=str(model),
            tokenizer_backend="huggingface",
            batch_size=4,  # several prompts in one request
            max_retries=1,
        )
        over_http = lm_eval_samples(served, data, 2, tmp_path / "b")
    assert over_http.keys() == in_process.keys()
    for subject, expected in in_process.items():
        assert np.allclose(over_http[subject], expected, atol=1e-4, rtol=0), subject
    assert len({tuple(q) for lls in in_process.values() for q in lls}) == data.n_questions  # prompts matter
