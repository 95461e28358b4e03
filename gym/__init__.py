"""gym: fine-tune LLMs from a dataset and a base model to an evaluated, registered model.

The library layer. Plain Python: it never imports prefect (flows/ and tasks/ wrap it).
"""

__version__ = "0.1.0"
