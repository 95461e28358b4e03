"""Evaluation: MMLU / C-Eval / CMMLU with gym's own evaluator (multiple_choice.py: reading in
mc_data.py, prompts and token ids in mc_prompt.py, scoring in mc_score.py), any lm-eval task
(lm_eval_bridge.py, lm_eval_tasks.py), generation metrics on held-out data (exact_match.py,
generation.py), one result format (results.py), and benchmarks as a flow stage (suite.py).
`gym eval` (cli.py) runs any of them from the command line."""
