"""Training-Free GRPO: the pure core (no Prefect): experience library, operations, parsing, group
selection, metrics, prompts and LLM clients. The specification is in the README (Training-Free GRPO).
"""
