"""SFT throughput on one GPU: gym's default settings vs plain TRL defaults, as one JSON line.

    python benchmarks/gpu_train.py                # on a CUDA GPU, ~0.5B Llama, bf16, ~2 minutes
    python benchmarks/gpu_train.py --finetuning-type qlora   # QLoRA on both sides, ~2.5 minutes
    python benchmarks/gpu_train.py --smoke        # tiny model on CPU: proves the script end to end

Without a CUDA GPU it stops at once (exit 2) unless --smoke is given; --skip must be at least 1 and
below --steps. Its temporary folder (~1 GB for the full model) is deleted at the end, also on SIGTERM.

Self-contained: it builds a Llama-shaped model (~0.5B parameters, vocab 32k) from a config with
a fixed seed and a synthetic learnable corpus (arithmetic token sequences of 900-1024 tokens), so
nothing is downloaded. It needs only torch, transformers, TRL (with datasets) and gym.train, and
liger-kernel / flash-attn where gym's defaults should use them. Each setting trains in its own
process (Liger patches transformers' modeling code process-wide, and peak memory must be the
setting's own):
- "gym": gym.train's SFT path (gym.train.plan, then gym.train.build_trainer, as `gym train` runs it)
  with TrainConfig defaults (speed "auto": Liger where installed, flash-attn + padding-free where
  installed, no gradient checkpointing), bf16 (float32 master weights);
- "trl": SFTTrainer with TRL 1.12's defaults (model path loaded in float32, bf16 autocast, gradient
  checkpointing, SDPA, padded).
With `--finetuning-type qlora`: gym's qlora stage (NF4 base, its default LoRA, paged 8-bit AdamW,
activation checkpointing) against TRL as its documentation sets QLoRA up (the model loaded 4-bit NF4
with double quantization and bf16 compute, a LoraConfig of gym's rank, alpha and target modules, TRL's
defaults otherwise).
Same model, data, order, learning rate and batch. Tokens/s counts real tokens after the first
`--skip` steps. MFU = tokens/s * (6 * N + 12 * layers * hidden * seq_len) / the GPU's peak bf16
FLOP/s, with N the matmul parameters: every layer's linear weights and the LM head (untied here; a
tied one would count once, as the head), not the input embedding (a lookup, no FLOPs) nor the norms;
QLoRA counts 4 * N (a frozen base has no weight gradients). The JSON's "params" is all parameters,
"matmul_params" N. Each side's settings name the optimizer its Trainer built ("optim", in
TrainingArguments' words, and "optimizer", its class). Peak memory from torch.cuda, beside
gym.train.memory's estimate of it for full fine-tuning (gym's settings: "memory_estimate_gib").
"loss_gap" is the largest gap between the two loss curves (smoothed).
Goal: gym/trl tokens/s >= 1.6 with the same loss curve.

On a lent GPU whose image lacks TRL and friends (Python 3.12 there), benchmarks/gpu_checks.sh
fetches the missing wheels here (`fetch`) and, there, installs them and runs this script and the
GPU-marked tests in one command (`run`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {
    # ~0.5B parameters, Llama-shaped (GQA, SwiGLU, RMSNorm, RoPE), untied output layer.
    "full": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "vocab_size": 32768,
    },
    "smoke": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}
# Dense bf16 peak FLOP/s by device name fragment (NVIDIA datasheets; H100/H200 SXM).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


def build_model_dir(shape: str, directory: Path, max_len: int) -> int:
    """Save a seeded, config-built Llama model and a tokenizer (for its pad token) in `directory`;
    returns its parameter count (a 4-bit model loaded from it stores fewer elements)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **SHAPES[shape],
        max_position_embeddings=max(max_len, 2048),
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
    )
    dtype = torch.float32 if shape == "smoke" else torch.bfloat16
    model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(directory, safe_serialization=True)
    AutoTokenizer.from_pretrained(REPO / "gym" / "assets" / "gym_tiny").save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def corpus(n: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> Any:
    """Learnable synthetic sequences: token i = (a + i * d) mod (vocab - 3) + 3, per-sequence a, d."""
    import torch
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
    span = vocab - 3  # ids 0-2 are pad/bos/eos
    for _ in range(n):
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        a = int(torch.randint(0, span, (1,), generator=g))
        d = int(torch.randint(1, 17, (1,), generator=g))
        ids = [(a + i * d) % span + 3 for i in range(length)]
        rows["input_ids"].append(ids)
        rows["labels"].append(ids)
    return Dataset.from_dict(rows)


class StepClock:
    """Trainer callback: wall time and real tokens of the steps after the first `skip` (warm-up)."""

    def __init__(self, skip: int) -> None:
        from transformers import TrainerCallback

        clock = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.tick(state)

        self.callback = _Callback()
        self.skip = skip
        self.start: tuple[float, int] | None = None
        self.end: tuple[float, int] | None = None

    def tick(self, state: Any) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        mark = (time.perf_counter(), int(state.num_input_tokens_seen))
        if state.global_step == self.skip:
            self.start = mark
        self.end = mark

    def tokens_per_second(self) -> float:
        assert self.start is not None and self.end is not None
        return (self.end[1] - self.start[1]) / (self.end[0] - self.start[0])


def worker(a: argparse.Namespace) -> dict[str, Any]:
    """Train one setting in this process and return its measurements."""
    import torch
    from transformers import AutoTokenizer

    model_dir = Path(a.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = corpus(a.steps * a.batch, SHAPES[a.shape]["vocab_size"], (a.min_len, a.max_len))
    out = model_dir.parent / f"out-{a.worker}"
    clock = StepClock(a.skip)
    common = {
        "output_dir": str(out),
        "max_steps": a.steps,
        "per_device_train_batch_size": a.batch,
        "learning_rate": a.lr,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.05,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
        "data_seed": 0,
        "include_num_input_tokens_seen": "non_padding",
    }
    qlora = a.finetuning_type == "qlora"
    if a.worker == "gym":
        from gym import train
        from gym.models import ModelRef
        from gym.train import TrainConfig, memory, speed

        config = TrainConfig(
            method="sft",
            finetuning_type=a.finetuning_type,
            **({"quant": {"bits": 4}} if qlora else {}),
            learning_rate=a.lr,
            max_steps=a.steps,
            per_device_train_batch_size=a.batch,
            bf16=a.shape != "smoke",
            logging_steps=1,
            save_steps=10**6,
            seed=0,  # the same data order as the TRL run
        )
        ref = ModelRef(name="gpu-bench", path=str(model_dir), template="chatml", digest="-", base_model="-")
        # gym.train.run's own path: the config made concrete (defaults, QLoRA's optimizer...), then the
        # model loaded (float32 master weights, bf16 autocast; QLoRA: a 4-bit base), adapted and wrapped.
        config, choices = train.plan(config, ref, len(data), 0, cutoff_len=a.max_len, longest=a.max_len)
        trainer = train.build_trainer(config, ref, data, None, out, out, a.max_len)[0]
        settings = {**dataclasses.asdict(speed.resolve(config)), **choices}
        if qlora:
            lora = config.lora.model_dump(include={"r", "alpha", "dropout"})
            settings["lora"] = {
                **lora,
                "target_modules": config.lora.target_modules or ref.lora_target_modules,
            }
        elif found := memory.step(config, ref, a.max_len, a.max_len):  # predicted peak, beside the measured
            estimate = memory.step_gib(config, *found, checkpointed=bool(config.gradient_checkpointing))
            settings["memory_estimate_gib"] = round(estimate, 4)
    else:
        from trl import SFTConfig, SFTTrainer

        # TRL 1.12's defaults: the model loads in float32 (a path, as users give it), bf16 autocast on,
        # gradient checkpointing on, chunked NLL loss, SDPA, padding. QLoRA as TRL's documentation
        # runs it: the model loaded 4-bit (NF4, double quantization, bf16 compute) and a LoRA config,
        # here the same rank, alpha and target modules as gym's.
        args = SFTConfig(**common, bf16=a.shape != "smoke", use_cpu=not torch.cuda.is_available())
        model: Any = str(model_dir)
        peft_config = None
        if qlora:
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            dtype = torch.bfloat16 if a.shape != "smoke" else torch.float32
            quantization = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            )
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, quantization_config=quantization, dtype=dtype
            )
            lora = json.loads(a.lora)
            peft_config = LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora["dropout"],
                target_modules=lora["target_modules"],
                task_type="CAUSAL_LM",
            )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
        settings = {
            "gradient_checkpointing": args.gradient_checkpointing,
            "attn_implementation": trainer.model.config._attn_implementation,
            "loss_type": args.loss_type,
        }
    trainer.add_callback(clock.callback)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    settings.update(optimizer_used(trainer))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {
        "setting": a.worker,
        "trainable": trainable,
        "tok_s": round(clock.tokens_per_second(), 1),
        "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "losses": [round(float(x), 4) for x in losses],
        "settings": settings,
    }


def optimizer_used(trainer: Any) -> dict[str, str]:
    """The optimizer the Trainer built: TrainingArguments' name for it and its class (under accelerate's
    wrapper), not the config's field, which is None where the default applies."""
    optim = trainer.args.optim
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {"optim": getattr(optim, "value", str(optim)), "optimizer": type(inner).__name__}


def matmul_params(shape: dict[str, int]) -> int:
    """Weights that multiply activations per token: attention (q, k, v, o), the MLP (gate, up, down) in every
    layer and the LM head; not the input embedding (a lookup) nor the norms (elementwise)."""
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * shape["intermediate_size"]
    return layers * per_layer + shape["vocab_size"] * h


def flops_per_token(shape: dict[str, int], seq_len: float, frozen: bool = False) -> float:
    """Training FLOPs per token: 6N (forward 2N, backward 4N) plus attention, 12 * layers * hidden * seq_len;
    4N for a frozen base (QLoRA: no weight gradients, only the activations' backward)."""
    attention = 12 * shape["num_hidden_layers"] * shape["hidden_size"] * seq_len
    return (4 if frozen else 6) * matmul_params(shape) + attention


def mfu(tok_s: float, shape: dict[str, int], seq_len: float, frozen: bool = False) -> float | None:
    """Model FLOPs utilisation: tokens/s * flops_per_token over the GPU's peak bf16 FLOP/s (None off CUDA
    or on a GPU not in PEAK_FLOPS)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    if peak is None:
        return None
    return round(tok_s * flops_per_token(shape, seq_len, frozen) / peak, 4)


def smooth(xs: list[float], k: int = 5) -> list[float]:
    return [sum(xs[max(0, i - k + 1) : i + 1]) / len(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with --steps, --skip and --batch resolved to their defaults (smoke or full) and
    checked: --skip (the warm-up left out of tokens/s) at least 1 and below --steps."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="Tiny model on CPU, a few steps (tests use it).")
    p.add_argument("--steps", type=int, help="Optimiser steps per setting (default 60; smoke 8).")
    p.add_argument(
        "--skip", type=int, help="Warm-up steps left out of tokens/s, 1 to steps - 1 (default 10; smoke 2)."
    )
    p.add_argument("--batch", type=int, help="Sequences per step (default 16; smoke 4).")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument(
        "--finetuning-type",
        choices=["full", "qlora"],
        default="full",
        help="full: full fine-tuning (gym's default SFT); qlora: a 4-bit NF4 base with LoRA on both sides.",
    )
    p.add_argument("--lora", help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=["gym", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--shape", default="full", help=argparse.SUPPRESS)
    p.add_argument("--min-len", type=int, help=argparse.SUPPRESS)
    p.add_argument("--max-len", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.steps = a.steps if a.steps is not None else (8 if a.smoke else 60)
    a.skip = a.skip if a.skip is not None else (2 if a.smoke else 10)
    a.batch = a.batch if a.batch is not None else (4 if a.smoke else 16)
    if a.batch < 1:
        p.error(f"--batch must be at least 1 (got {a.batch})")
    if not 1 <= a.skip < a.steps:
        p.error(
            f"--skip {a.skip} with --steps {a.steps}: tokens/s counts the steps after the first --skip, "
            "so --skip must be at least 1 and --steps larger than --skip"
        )
    return a


def main() -> None:
    a = parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(a)), flush=True)
        return
    import torch

    if not a.smoke and not torch.cuda.is_available():
        print(
            "gpu_train.py: no CUDA GPU here (it would train a 0.5B model in bf16 on the CPU for hours); "
            "run it on a CUDA GPU, or add --smoke for the tiny CPU check",
            file=sys.stderr,
        )
        raise SystemExit(2)
    # A SIGTERM (a job's time limit, `kill`) unwinds like Ctrl-C: the running worker is killed
    # (subprocess.run does that on any exception) and the temporary folder deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shape = "smoke" if a.smoke else "full"
    steps, skip, batch = a.steps, a.skip, a.batch
    min_len, max_len = (24, 48) if a.smoke else (900, 1024)
    root = Path(tempfile.mkdtemp(prefix="gym-gpu-bench-"))
    env = {
        **os.environ,
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if a.smoke:
        env.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    try:
        params = build_model_dir(shape, root / "model", max_len)
        results: dict[str, dict[str, Any]] = {}
        qlora = a.finetuning_type == "qlora"
        for setting in ("gym", "trl") if qlora else ("trl", "gym"):  # TRL's QLoRA takes gym's LoRA shape
            cmd = [
                sys.executable,
                __file__,
                f"--worker={setting}",
                f"--model-dir={root / 'model'}",
                f"--shape={shape}",
                f"--steps={steps}",
                f"--skip={skip}",
                f"--batch={batch}",
                f"--lr={a.lr}",
                f"--min-len={min_len}",
                f"--max-len={max_len}",
                f"--finetuning-type={a.finetuning_type}",
            ]
            if setting == "trl" and qlora:
                cmd.append(f"--lora={json.dumps(results['gym']['settings']['lora'])}")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                sys.exit(f"{setting} run failed:\n{proc.stderr[-4000:]}")
            results[setting] = json.loads(lines[-1].removeprefix("RESULT "))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seq_len = (min_len + max_len) / 2
    gym, trl = results["gym"], results["trl"]
    gap = max(abs(x - y) for x, y in zip(smooth(gym["losses"]), smooth(trl["losses"]), strict=False))
    summary = {
        "device": _device(),
        "finetuning_type": a.finetuning_type,
        "params": params,
        "matmul_params": matmul_params(SHAPES[shape]),
        "trainable": [gym["trainable"], trl["trainable"]],
        "steps": steps,
        "batch": batch,
        "seq_len": seq_len,
        "gym_tok_s": gym["tok_s"],
        "trl_tok_s": trl["tok_s"],
        "speedup": round(gym["tok_s"] / trl["tok_s"], 3),
        "gym_mfu": mfu(gym["tok_s"], SHAPES[shape], seq_len, frozen=qlora),
        "trl_mfu": mfu(trl["tok_s"], SHAPES[shape], seq_len, frozen=qlora),
        "gym_peak_gb": gym["peak_gb"],
        "trl_peak_gb": trl["peak_gb"],
        "gym_loss_first_last": [gym["losses"][0], gym["losses"][-1]],
        "trl_loss_first_last": [trl["losses"][0], trl["losses"][-1]],
        "loss_gap": round(gap, 4),
        "gym_settings": gym["settings"],
        "trl_settings": trl["settings"],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary))


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
