"""How a model's weights are adapted for training: every `finetuning_type`, for every method.

- full: every weight trains.
- freeze: only the last N decoder layers (or named submodules of them, plus named extra modules) train;
  every other tensor has requires_grad off and stays bit-identical.
- the LoRA family, through PEFT: lora; rslora (alpha/sqrt(r) scaling); dora (weight-decomposed);
  pissa (adapter initialised from the principal singular vectors, the residual left in the base);
  loraplus (B learns `loraplus_lr_ratio` times faster than A: PEFT's LoRA+ optimizer); longlora (LoRA
  plus fully trained embeddings and norms, and shifted sparse attention from gym.train.s2attn);
  qlora (LoRA over a bitsandbytes-quantized frozen base, gym.train.quant).

A sequence-classification model's new head (a reward model's `score`, method rm) trains under every type:
freeze keeps it trainable, and the LoRA family's PEFT task is then SEQ_CLS, which trains and saves it.

gym wraps the model itself (rather than handing TRL a peft_config) so every method gets the same
adapter, LoRA+ can build its optimizer from the wrapped model, and PiSSA's initial adapter can be
kept: TRL's preference trainers copy a pre-wrapped model's initial adapter into a frozen "ref"
adapter, which makes the reference the starting model even where the base alone is not (PiSSA).

    model = adapters.adapt(load_model(ref, **quant.load_kwargs(config)), config, ref, stage_dir)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gym import workspace
from gym.errors import ConfigError
from gym.models import ModelRef
from gym.train import rope
from gym.train.config import LORA_TYPES, LoraSettings, TrainConfig

PISSA_INIT = "pissa_init"  # the stage's copy of PiSSA's initial adapter (to save a plain LoRA at the end)
LORAPLUS_RATIO = 16.0  # LoRA+ paper (Hayou et al. 2024): eta_B / eta_A = 2^4 works across their tasks
NOTHING_TO_FREEZE = "freeze trains nothing: set freeze.layers to a non-zero N, or freeze.extra_modules"
HEADED_METHODS = ("rm",)  # methods whose model has a new head (task_head), which trains under freeze too


# The LoRA settings each variant's finetuning_type stands for.
IMPLIED: dict[str, dict[str, Any]] = {
    "rslora": {"use_rslora": True},
    "dora": {"use_dora": True},
    "pissa": {"init": "pissa"},
}


def lora_settings(config: TrainConfig) -> LoraSettings:
    """The LoRA settings a finetuning_type implies on top of `config.lora`; ConfigError where the user set
    one otherwise (`finetuning_type pissa` with `lora.init gaussian`: the variant silently won)."""
    for name, value in IMPLIED.get(config.finetuning_type, {}).items():
        if getattr(config.lora, name) not in (value, type(config.lora).model_fields[name].default):
            raise ConfigError(
                f"finetuning_type {config.finetuning_type} is LoRA with lora.{name} {value}, but lora.{name} "
                f"is {getattr(config.lora, name)}: drop lora.{name}, or use finetuning_type lora"
            )
    update = dict(IMPLIED.get(config.finetuning_type, {}))
    if config.finetuning_type == "loraplus" and config.lora.loraplus_lr_ratio is None:
        update["loraplus_lr_ratio"] = LORAPLUS_RATIO
    return config.lora.model_copy(update=update)


def check(config: TrainConfig, model_ref: ModelRef) -> None:
    """Settings that can't work together, found from the config and the model's config.json alone."""
    if config.finetuning_type == "qlora" and config.lora.init == "pissa":
        raise ConfigError(
            "PiSSA initialisation decomposes full-precision weights and can't start from a quantized base: "
            "use finetuning_type pissa (unquantized), or qlora with lora.init default"
        )
    if model_ref.new_token_ids and config.speed.liger == "on" and config.finetuning_type in LORA_TYPES:
        raise ConfigError(
            "speed.liger=on: Liger's fused loss reads the output layer's weight directly, which skips the "
            "trainable rows of the new tokens (new_special_tokens) beside the adapter; set liger auto or off"
        )
    if config.finetuning_type == "freeze":
        n = _model_config(model_ref).get("num_hidden_layers")
        if isinstance(n, int) and abs(config.freeze.layers) > n:
            raise ConfigError(
                f"freeze.layers={config.freeze.layers}, but {model_ref.name} has {n} decoder layers; "
                f"use a value between -{n} and {n}"
            )
        # What freeze_selection trains besides layers and extra modules: a reward model's new head (rm),
        # and new token rows' embeddings; without any of them, it would end after the model loaded.
        if not (config.freeze.layers or config.freeze.extra_modules or model_ref.new_token_ids) and (
            config.method not in HEADED_METHODS
        ):
            raise ConfigError(NOTHING_TO_FREEZE)


def check_modules(config: TrainConfig, model_ref: ModelRef) -> None:
    """The LoRA target modules and freeze layers the user named, against the model's architecture built
    on the meta device from its config alone (no weights read): for gym.preflight, before any model
    loads. Nothing to check (and nothing imported) when neither was set."""
    targets = config.lora.target_modules if config.finetuning_type in LORA_TYPES else None
    if not targets and config.finetuning_type != "freeze":
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    trust = model_ref.trust_remote_code
    model_config = AutoConfig.from_pretrained(
        model_ref.path, revision=model_ref.revision, trust_remote_code=trust
    )
    n = getattr(model_config, "num_hidden_layers", None)
    if config.finetuning_type == "freeze" and isinstance(n, int) and abs(config.freeze.layers) > n:
        raise ConfigError(
            f"freeze.layers={config.freeze.layers}, but {model_ref.name} has {n} decoder layers; "
            f"use a value between -{n} and {n}"
        )
    named = config.finetuning_type == "freeze" and (config.freeze.modules or config.freeze.extra_modules)
    if targets or named:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(model_config, trust_remote_code=trust)
        if targets:
            lora_targets(skeleton, targets, model_ref)
        else:
            freeze_selection(skeleton, config)


# What each adapter section of TrainConfig sets up, and the finetuning_types that read it: one a type
# doesn't read, set all the same, gets a note (`unused_settings`) naming the type that would.
SECTION_TYPES: dict[str, tuple[str, ...]] = {
    "lora": LORA_TYPES,
    "freeze": ("freeze",),
    "longlora": ("longlora",),
    "quant": ("qlora",),
}


def unused_settings(config: TrainConfig) -> str | None:
    """A note when the user set adapter settings the stage's finetuning_type does not read (LoRA settings
    for full or freeze, freeze settings for anything else, LongLoRA's for any type but longlora, QLoRA's
    quantization for any type but qlora), naming the type that reads them; else None. The stage trains
    as its type says. Before `plan`, which sets them."""
    kind = config.finetuning_type
    why = {
        "lora": f"finetuning_type {kind} trains the weights themselves, no adapter (the LoRA family's "
        "types read them: --finetuning_type lora, dora, qlora...)",
        "freeze": f"they choose what finetuning_type freeze trains, not {kind}",
        "longlora": "they set up finetuning_type longlora (--finetuning_type longlora: LoRA with shifted "
        f"sparse attention and trained embeddings and norms), not {kind}",
        "quant": "they quantize the frozen base under finetuning_type qlora's adapter (--finetuning_type "
        f"qlora); finetuning_type {kind} loads the model unquantized",
    }
    unused = [
        f"the {section} settings are unused: {why[section]}"
        for section, kinds in SECTION_TYPES.items()
        if kind not in kinds
        and section in config.model_fields_set
        and getattr(config, section) != type(getattr(config, section))()  # as good as unset: no note
    ]
    return "; ".join(unused) or None


def new_rows(config: TrainConfig, model_ref: ModelRef) -> dict[str, str]:
    """The stage's choice for rows of tokens added to the vocabulary (gym.vocab), in words."""
    if not model_ref.new_token_ids:
        return {}
    how = {
        "full": "with every weight",
        "freeze": "with the embeddings and output layer, trained beside the chosen layers",
    }.get(config.finetuning_type, "as PEFT trainable tokens beside the adapter (a tied output layer's too)")
    if config.finetuning_type == "longlora" and config.longlora.trainable_modules is None:
        how = "with the embeddings LongLoRA trains in full"
    ids = ", ".join(map(str, model_ref.new_token_ids))
    return {"new_special_tokens": f"{len(model_ref.new_token_ids)} new token rows (ids {ids}) train {how}"}


def _model_config(model_ref: ModelRef) -> dict[str, Any]:
    path = Path(model_ref.path) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def adapt(model: Any, config: TrainConfig, model_ref: ModelRef, stage_dir: Path, wrap: bool = True) -> Any:
    """`model` ready to train as `config.finetuning_type` says (a PeftModel for the LoRA family).

    With `wrap=False` a LoRA-family model is prepared (quantization, attention) but not wrapped: for a
    trainer that applies `lora_config(...)` itself (TRL's peft_config).
    """
    if config.finetuning_type == "full":
        return model
    if config.finetuning_type == "freeze":
        freeze(model, config, new_tokens=bool(model_ref.new_token_ids))
        return model
    from peft import get_peft_model

    if config.finetuning_type == "qlora":
        from gym.train import quant

        quant.keep_trainable_layout(model)
        quant.freeze_as_stored(model)
        if config.gradient_checkpointing and not wrap:  # wrapped: done on the PeftModel below
            model.enable_input_require_grads()
    if config.finetuning_type == "longlora" and config.longlora.shift_attention:
        from gym.train import s2attn

        s2attn.enable(model, config.longlora.group_size_ratio)
    if not wrap:
        return model
    peft_model = get_peft_model(model, lora_config(model, config, model_ref))
    if config.gradient_checkpointing:
        peft_model.enable_input_require_grads()
    if lora_settings(config).init == "pissa":
        # From here on the adapter is an ordinary LoRA over the residual base: re-initialising it (a "ref"
        # copy, a reload) must not run the decomposition again. Keep the initial adapter: the final one is
        # saved as a plain LoRA of the original base against it.
        peft_model.peft_config["default"].init_lora_weights = True
        init_dir = stage_dir / PISSA_INIT
        if not init_dir.exists():
            with workspace.atomic_dir(init_dir) as tmp:
                peft_model.save_pretrained(str(tmp))
    return peft_model


def trainer_peft_config(model: Any, config: TrainConfig, model_ref: ModelRef, wrapped: bool) -> Any | None:
    """What a trainer's `peft_config` gets: the LoraConfig when it applies the adapter itself, else None."""
    return (
        None if wrapped or config.finetuning_type not in LORA_TYPES else lora_config(model, config, model_ref)
    )


def lora_config(model: Any, config: TrainConfig, model_ref: ModelRef) -> Any:
    """The PEFT LoraConfig for a LoRA-family finetuning_type."""
    from peft import LoraConfig

    lora = lora_settings(config)
    init: Any = {"default": True, "pissa": "pissa", "gaussian": "gaussian"}[lora.init]
    extra = (longlora_modules(model, config) or None) if config.finetuning_type == "longlora" else None
    # A reward model (rm): PEFT's SEQ_CLS task trains and saves its new score head beside the adapter.
    classifier = task_head(model) is not None
    tied = bool(getattr(model.config, "tie_word_embeddings", False)) and not classifier  # no output layer
    # Rows of tokens added to the vocabulary (gym.vocab) train beside the adapter, unless the whole
    # embedding matrix does (LongLoRA): PEFT's trainable tokens, the tied output layer's rows with them.
    embed = model.get_input_embeddings()
    whole = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m is embed} & set(extra or [])
    rows = model_ref.new_token_ids if model_ref.new_token_ids and not whole else None
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora_targets(model, lora.target_modules, model_ref),
        use_rslora=lora.use_rslora,
        use_dora=lora.use_dora,
        init_lora_weights=init,
        modules_to_save=extra,
        trainable_token_indices=rows,
        # A trained copy of tied input embeddings must stay tied to the output layer, as in the base model.
        ensure_weight_tying=tied and extra is not None,
        task_type="SEQ_CLS" if classifier else "CAUSAL_LM",
    )


def lora_targets(model: Any, given: list[str] | None, model_ref: ModelRef) -> list[str]:
    """The module names LoRA adapts: `given` (lora.target_modules), else the registry's for the model;
    a name the model doesn't have is a ConfigError listing the linear layers it does have."""
    import torch

    targets = given or model_ref.lora_target_modules
    modules = dict(model.named_modules())
    missing = [t for t in targets if not _named(modules, t)]
    linear = {n.rsplit(".", 1)[-1] for n, m in modules.items() if n and isinstance(m, torch.nn.Linear)}
    there = f"its linear layers: {', '.join(sorted(linear))}"
    for name in given or ():  # a block of layers (`mlp`, `self_attn`): PEFT's "Target module not supported"
        if block := next((m for m in _named(modules, name) if not _adaptable(m)), None):
            raise ConfigError(
                f"lora.target_modules: {name!r} in {model_ref.name} is a {type(block).__name__}, not a layer "
                f"LoRA adapts (linear, embedding, convolution): name its layers instead; {there}"
            )
    if not missing or (not given and len(missing) < len(targets)):  # defaults: those the model has
        return targets
    if given:
        name = missing[0]
        if "," in name:  # gym's list flag takes its values apart, not one comma-separated value
            parts = " ".join(n.strip() for n in name.split(",") if n.strip())
            raise ConfigError(
                f"lora.target_modules: {name!r} is one name: give the names apart "
                f"(--train.lora.target_modules {parts}; YAML: a list), or comma-separated through "
                f"LLaMA-Factory's --lora_target {name}"
            )
        raise ConfigError(f"lora.target_modules: {model_ref.name} has no module named {name!r}; {there}")
    raise ConfigError(
        f"{model_ref.name} has none of the modules LoRA adapts by default ({', '.join(targets)}); {there}: "
        "name them in lora.target_modules (--lora_target)"
    )


def _named(modules: dict[str, Any], name: str) -> list[Any]:
    """The modules called `name`, in full or as the last parts of their dotted names (as PEFT matches)."""
    return [m for n, m in modules.items() if n and (n == name or n.endswith("." + name))]


def _adaptable(module: Any) -> bool:
    """Whether PEFT's LoRA wraps a module of this kind: linear, embedding and convolution layers
    (transformers' GPT-2 style Conv1D, and bitsandbytes' quantized linear layers, included)."""
    import torch

    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    return isinstance(module, kinds) or type(module).__name__ in ("Conv1D", "Linear8bitLt", "Linear4bit")


def adapts_output_layer(model: Any, peft_config: Any | None) -> bool:
    """Whether LoRA adapts the model's output layer (`lm_head`): the model, wrapped already, has an
    adapter layer there, or the `peft_config` a trainer will apply names it among its target modules.
    Losses that read that layer's weight directly would skip the adapter (TRL refuses its chunked loss)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get else None
    if head is not None and "peft" in sys.modules:  # a model wrapped by PEFT: the layer is its tuner layer
        from peft.tuners.tuners_utils import BaseTunerLayer

        if isinstance(head, BaseTunerLayer):
            return True
    targets = getattr(peft_config, "target_modules", None)
    if not targets or head is None or isinstance(targets, str):  # a str: PEFT's all-linear, or a regex
        return False
    names = [n for n, m in model.named_modules() if m is head]
    return any(n == t or n.endswith("." + t) for n in names for t in targets)


def output_layer_wrapped(model: Any) -> bool:
    """Whether PEFT wraps the model's output layer (trainable token rows of gym.vocab's new tokens):
    losses that read its weight directly would bypass the wrapper."""
    get = getattr(model, "get_output_embeddings", None)
    return type(get() if get else None).__name__ == "TrainableTokensWrapper"


def task_head(model: Any) -> Any | None:
    """A sequence-classification model's output head (`score`, or `classifier`): new weights that train
    under every adaptation type (a reward model's head); None for a causal LM."""
    if not type(model).__name__.endswith("ForSequenceClassification"):
        return None
    return getattr(model, "score", None) or getattr(model, "classifier", None)


def longlora_modules(model: Any, config: TrainConfig) -> list[str]:
    """Module names LongLoRA trains in full: given ones, or the input embeddings and every norm layer."""
    names = dict(model.named_modules())
    if config.longlora.trainable_modules is not None:
        wanted = config.longlora.trainable_modules
        for w in wanted:
            if not _named(names, w):
                raise ConfigError(
                    f"longlora.trainable_modules: no module named {w!r} in the model; "
                    f"leaf names there: {', '.join(sorted(_leaf_names(model)))}"
                )
        return list(wanted)
    embed = model.get_input_embeddings()
    out = {n.rsplit(".", 1)[-1] for n, m in names.items() if m is embed}
    out |= {n.rsplit(".", 1)[-1] for n, m in names.items() if n and "norm" in type(m).__name__.lower()}
    return sorted(out)


def _leaf_names(model: Any) -> set[str]:
    return {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if n}


def decoder_layers(model: Any) -> tuple[str, Any]:
    """(name, ModuleList) of the model's decoder layers: the module list as long as num_hidden_layers."""
    import torch

    n = getattr(model.config, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return name, module
    raise ConfigError(
        f"can't find the decoder layers of {type(model).__name__} (no module list of num_hidden_layers={n} "
        "layers): use finetuning_type full or a LoRA type, or name what to train in freeze.extra_modules "
        "with freeze.layers 0"
    )


def freeze(model: Any, config: TrainConfig, new_tokens: bool = False) -> None:
    """Leave only the chosen layers/modules trainable (requires_grad), everything else frozen;
    `new_tokens` (gym.vocab added rows): the embeddings and output layer train too."""
    selected = freeze_selection(model, config, new_tokens)
    for p in model.parameters():
        p.requires_grad_(False)
    # Through the modules, not parameter names: a tied weight (embeddings = output layer) has one name only.
    for module in selected:
        for p in module.parameters():
            p.requires_grad_(True)


def freeze_selection(model: Any, config: TrainConfig, new_tokens: bool = False) -> list[Any]:
    """The modules freeze trains (a ConfigError naming what the model lacks); also on a meta-device
    skeleton, for gym.preflight (check_modules)."""
    settings = config.freeze
    selected = []
    if settings.layers:
        prefix, layers = decoder_layers(model)
        n = len(layers)
        indices = range(n - settings.layers, n) if settings.layers > 0 else range(-settings.layers)
        for i in indices:
            layer = layers[i]
            if settings.modules is None:
                selected.append(layer)
                continue
            for sub in settings.modules:
                try:
                    selected.append(layer.get_submodule(sub))
                except AttributeError:
                    children = ", ".join(name for name, _ in layer.named_children())
                    raise ConfigError(
                        f"freeze.modules: layer {prefix}.{i} has no submodule {sub!r}; its parts: {children}"
                    ) from None
    names = dict(model.named_modules())
    for extra in settings.extra_modules:
        found = _named(names, extra)
        if not found:
            raise ConfigError(
                f"freeze.extra_modules: no module named {extra!r}; "
                f"leaf names there: {', '.join(sorted(_leaf_names(model)))}"
            )
        selected += found
    head = task_head(model)
    if head is not None:  # a new reward head trains whatever layers do
        selected.append(head)
    if new_tokens:  # new rows start from a draw: they must train whatever else is frozen
        embeddings = (model.get_input_embeddings(), model.get_output_embeddings())
        selected += [m for m in embeddings if m is not None]
    if not selected:
        raise ConfigError(NOTHING_TO_FREEZE)
    return selected


def attach_optimizer(trainer: Any, config: TrainConfig) -> None:
    """LoRA+: give the trainer PEFT's optimizer with B's learning rate `loraplus_lr_ratio` x A's."""
    ratio = lora_settings(config).loraplus_lr_ratio
    if ratio is None or config.finetuning_type not in LORA_TYPES:
        return
    from peft.optimizers import create_loraplus_optimizer
    from transformers import Trainer

    # The optimizer class and its settings (betas, eps, 8-bit...) as the trainer itself would choose them.
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    kwargs.pop("lr", None)
    trainer.optimizer = create_loraplus_optimizer(
        trainer.model,
        cls,
        lr=trainer.args.learning_rate,
        loraplus_lr_ratio=ratio,
        loraplus_weight_decay=config.weight_decay,
        **kwargs,
    )


def restore_adapter(model: Any, checkpoint: str) -> None:
    """Load the trained adapter of `checkpoint` before the trainer resumes from it.

    transformers 5.17 resumes a PeftModel that holds several adapters (TRL's frozen "ref" copy beside
    the trained "default") by loading only the adapters saved in sub-folders; "default", saved at the
    checkpoint's root, would silently restart from its initialisation.
    """
    from peft import PeftModel

    if isinstance(model, PeftModel) and len(model.peft_config) > 1:
        model.load_adapter(checkpoint, adapter_name="default", is_trainable=True)
        model.set_adapter("default")


def save_adapter(
    model: Any, stage_dir: Path, adapter_dir: Path, stretch: dict[str, Any] | None = None, max_length: int = 0
) -> None:
    """Save a PeftModel's trained adapter to `adapter_dir` (atomically), ready to merge afterwards.
    `stretch`: the RoPE scaling the base was loaded with (gym.train.rope), recorded beside the adapter.

    PiSSA's adapter is saved as the equivalent plain LoRA of the original base (PEFT's conversion
    against the initial adapter), so it applies to the base model users have.
    """
    if "ref" in model.peft_config:  # TRL's frozen copy of the initial adapter, the reference of DPO/KTO
        model.delete_adapter("ref")
    from gym.train import s2attn

    s2attn.disable(model.get_base_model())
    init_dir = stage_dir / PISSA_INIT
    if not adapter_dir.exists():
        with workspace.atomic_dir(adapter_dir) as tmp:
            if init_dir.is_dir():
                model.save_pretrained(str(tmp), path_initial_model_for_weight_conversion=str(init_dir))
            else:
                model.save_pretrained(str(tmp))
            rope.save_for_adapter(tmp, stretch or {}, max_length)
