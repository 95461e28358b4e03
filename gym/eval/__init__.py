"""Evaluation: exact match on held-out instruction data (and, in later issues, MMLU/C-Eval/CMMLU)."""
