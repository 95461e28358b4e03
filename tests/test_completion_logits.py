"""Preference log-probs from completion windows (gym.train.completion_logits): the windows' arithmetic,
and gym's DPO and KTO trainers against TRL's own `_compute_loss` on the same batch: the same loss,
gradients and metrics for every loss gym offers, with the reference precomputed, live, or the
LoRA-disabled base, while the LM head sees only the completion windows (KTO's KL rows too); gym's
SimPO and ORPO against TRL's CPOTrainer and ORPOTrainer forwards likewise."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import load_from_disk
from trl import DPOTrainer, KTOTrainer

from gym.models import load_model, load_tokenizer
from gym.train import TrainConfig, adapters, completion_logits, dpo, kto, orpo, simpo
from gym.train.config import with_defaults
from tests.helpers import ARCHITECTURES, tiny, tokenized


def test_window_keeps_the_position_before_each_completion_and_the_completion():
    mask = torch.tensor(
        [
            [0, 0, 0, 1, 1, 0, 0, 0],  # prompt of 3, answer of 2, padding
            [0, 0, 0, 0, 0, 1, 1, 1],  # the answer reaches the row's end
            [0, 0, 0, 0, 0, 0, 0, 0],  # nothing to learn (truncated away)
            [1, 1, 0, 0, 0, 0, 0, 0],  # truncated from the start: TRL never predicts position 0
        ]
    )
    index, kept = completion_logits.window(mask)
    assert index.tolist() == [[2, 3, 4, 5], [4, 5, 6, 7], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert kept.tolist() == [[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]]
    # TRL's view: shifted mask positions; the window holds the same labels, once each.
    for row, (i, k) in enumerate(zip(index, kept, strict=True)):
        labels = {int(i[j]) for j in range(1, len(i)) if k[j]}
        assert labels == {p for p in range(1, 8) if mask[row, p]}


def test_window_is_none_when_it_saves_nothing():
    assert completion_logits.window(torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])) is None
    assert completion_logits.window(torch.zeros(2, 5, dtype=torch.long)) is None


def build(tmp_path, finetuning_type: str, reference: str, perturb: bool = True, **settings):
    """gym's DPO (or KTO, or SimPO) trainer on gym-tiny and 64 demo records, as gym.train builds it, and one
    training batch (the same one whatever ran before in this process: the sampler draws from torch's RNG)."""
    torch.manual_seed(0)
    model_ref = tiny()
    method = settings.pop("method", "dpo")
    data = tokenized("demo_kto" if method == "kto" else "demo_dpo", model_ref, max_samples=64)
    config = with_defaults(
        TrainConfig(
            method=method,
            finetuning_type=finetuning_type,
            reference=reference,
            per_device_train_batch_size=8,
            **settings,
        ),
        model_ref.train_defaults,
    )
    model = load_model(model_ref)
    trainer = {"kto": kto, "simpo": simpo, "orpo": orpo}.get(method, dpo).build_trainer(
        model=model,
        tokenizer=load_tokenizer(model_ref),
        config=config,
        train_data=load_from_disk(str(data)),
        eval_data=None,
        output_dir=tmp_path / "checkpoints",
        peft_config=adapters.trainer_peft_config(model, config, model_ref, wrapped=False),
        max_length=64,
    )
    # Move the policy away from the reference, so log-ratios, rewards and margins are not all zero.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad and perturb:
                p.add_(torch.randn(p.shape, generator=g).to(p.device) * 0.02)
    if config.gradient_checkpointing:  # as the Trainer does when training starts
        trainer.model.gradient_checkpointing_enable(trainer.args.gradient_checkpointing_kwargs)
        assert trainer.model.is_gradient_checkpointing
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.model.train()  # TRL files the metrics under "train"
    return trainer, batch


def loss_grads_metrics(trainer, batch, compute):
    trainer.model.zero_grad()
    trainer._metrics["train"].clear()
    trainer._total_train_tokens = 0  # TRL's running token count
    widths: list[int] = []
    body: list[tuple[int, int]] = []  # the (rows, tokens) each forward ran through the model
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    head = unwrapped.get_output_embeddings()
    handles = [
        head.register_forward_hook(lambda m, args, out: widths.append(out.shape[1])),
        unwrapped.get_input_embeddings().register_forward_hook(
            lambda m, a, out: body.append(tuple(out.shape[:2]))
        ),
    ]
    try:
        loss = compute(trainer, trainer.model, batch, False)
    finally:
        for handle in handles:
            handle.remove()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.detach(), grads, metrics, widths, body


CASES = [
    ("full", "precomputed", {}),
    ("full", "live", {}),
    ("lora", "live", {}),
    ("full", "precomputed", {"method": "ipo"}),
    ("full", "precomputed", {"method": "hinge"}),
    ("full", "live", {"method": "cdpo"}),
    ("full", "precomputed", {"sft_loss_weight": 0.5}),
    ("full", "precomputed", {"method": "kto"}),
    ("lora", "live", {"method": "kto"}),
    ("full", "live", {"gradient_checkpointing": True}),
]


@pytest.mark.parametrize(
    ("finetuning_type", "reference", "settings"),
    CASES,
    ids=["dpo", "live", "lora", "ipo", "hinge", "cdpo", "rpo", "kto", "kto_lora", "checkpointing"],
)
def test_gyms_dpo_equals_trls_in_loss_gradients_and_metrics(tmp_path, finetuning_type, reference, settings):
    trainer, batch = build(tmp_path, finetuning_type, reference, **settings)
    trl_class = KTOTrainer if settings.get("method") == "kto" else DPOTrainer
    ours = loss_grads_metrics(trainer, batch, type(trainer)._compute_loss)
    theirs = loss_grads_metrics(trainer, batch, trl_class._compute_loss)

    lengths = {batch[key].shape[1] for key in ("input_ids", "KL_input_ids") if key in batch}
    assert theirs[3] and set(theirs[3]) <= lengths
    assert len(ours[3]) == len(theirs[3]), "the same forward passes (KTO's KL rows included)"
    assert all(w < min(lengths) / 2 for w in ours[3]), "the LM head sees only the completion windows"
    if (
        trl_class is DPOTrainer
    ):  # each pair once: [prompt, chosen, rejected], fewer tokens than TRL's two rows
        pairs = batch["input_ids"].shape[0] // 2
        assert all(rows == pairs for rows, _ in ours[4]) and ours[4]
        assert all(r * t < 0.75 * theirs[4][0][0] * theirs[4][0][1] for r, t in ours[4])
    # Equal policy and reference give exactly ln 2; a LoRA perturbation moves it by ~1e-3 only.
    assert ours[0].item() != pytest.approx(math.log(2), abs=1e-5) or settings, "policy and reference differ"
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    assert ours[1].keys() == theirs[1].keys() and ours[1]
    for name, grad in ours[1].items():
        assert torch.allclose(grad, theirs[1][name], rtol=1e-4, atol=1e-6), name
    assert ours[2].keys() == theirs[2].keys()
    assert abs(ours[2]["rewards/margins"]) > 1e-4
    for key, value in ours[2].items():
        assert value == pytest.approx(theirs[2][key], rel=1e-4, abs=1e-5), key


def test_reference_log_probs_equal_trls(tmp_path):
    trainer, batch = build(tmp_path, "lora", "live")
    ours = trainer.compute_ref_log_probs(trainer.model, batch)
    theirs = DPOTrainer.compute_ref_log_probs(trainer, trainer.model, batch)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    trainer, batch = build(tmp_path, "lora", "live", method="kto")  # TRL calls the model positionally here
    head = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings()
    widths: list[int] = []
    handle = head.register_forward_hook(lambda m, args, out: widths.append(out.shape[1]))
    ours = trainer.compute_ref_log_probs(trainer.model, batch)
    handle.remove()
    theirs = KTOTrainer.compute_ref_log_probs(trainer, trainer.model, batch)
    assert len(ours) == 2 and ours[1] is not None, "the completions' and the KL rows' log-probs"
    assert len(widths) == 2 and all(w < batch["input_ids"].shape[1] / 2 for w in widths)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    # The precomputed column gym trains with (computed at set-up, through the windows) is TRL's too.
    trainer, batch = build(tmp_path, "full", "precomputed", perturb=False)
    assert torch.allclose(
        torch.stack([batch["ref_chosen_logps"], batch["ref_rejected_logps"]]),
        torch.stack(DPOTrainer.compute_ref_log_probs(trainer, trainer.ref_model or trainer.model, batch)),
        rtol=1e-5,
        atol=1e-5,
    )


def test_hooks_are_gone_after_each_call_even_when_it_fails(tmp_path):
    trainer, batch = build(tmp_path, "full", "live")
    model = trainer.model
    before = (len(model._forward_pre_hooks), len(model.get_output_embeddings()._forward_pre_hooks))
    trainer._compute_loss(model, batch, False)

    def fail(module, args):
        raise RuntimeError("the model failed")

    handle = model.model.norm.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="the model failed"):
        trainer._compute_loss(model, batch, False)
    handle.remove()
    assert (len(model._forward_pre_hooks), len(model.get_output_embeddings()._forward_pre_hooks)) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_gyms_dpo_equals_trls(tmp_path):
    trainer, batch = build(tmp_path, "lora", "live")
    assert batch["input_ids"].is_cuda and next(trainer.model.parameters()).is_cuda
    ours = loss_grads_metrics(trainer, batch, type(trainer)._compute_loss)
    theirs = loss_grads_metrics(trainer, batch, DPOTrainer._compute_loss)
    assert all(w < batch["input_ids"].shape[1] / 2 for w in ours[3])
    assert torch.allclose(ours[0], theirs[0], rtol=1e-3, atol=1e-4)
    for name, grad in ours[1].items():
        assert torch.allclose(grad, theirs[1][name], rtol=1e-2, atol=1e-4), name
    for key, value in ours[2].items():
        assert value == pytest.approx(theirs[2][key], rel=1e-3, abs=1e-4), key


def test_a_forward_that_bypasses_the_output_module_gets_its_logits_cut_after(tmp_path, monkeypatch):
    """A patched forward (Unsloth's, say) may compute the logits without calling the output layer as a
    module: the hook after the model cuts its full logits to the windows, and the numbers still agree."""
    trainer, batch = build(tmp_path, "full", "live")
    monkeypatch.setattr(completion_logits, "_output_head", lambda module, unwrap: torch.nn.Identity())
    ours = loss_grads_metrics(trainer, batch, type(trainer)._compute_loss)
    theirs = loss_grads_metrics(trainer, batch, DPOTrainer._compute_loss)
    assert all(w >= batch["input_ids"].shape[1] for w in ours[3]), "the real output layer saw every position"
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    for name, grad in ours[1].items():
        assert torch.allclose(grad, theirs[1][name], rtol=1e-4, atol=1e-6), name
    for key, value in ours[2].items():
        assert value == pytest.approx(theirs[2][key], rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize("family", ["llama", *ARCHITECTURES])
def test_every_registry_family_gives_the_same_answer_log_probs_from_windows(family):
    """The hooks on config-built tiny models of the registry's families (their own heads, Gemma's
    logit softcapping), called as TRL calls them: by keyword and positionally."""
    import transformers
    from trl.trainer.utils import selective_log_softmax

    config_name, model_name, extra = ARCHITECTURES.get(family, ("LlamaConfig", "LlamaForCausalLM", {}))
    size = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    if family == "gemma2":
        extra = {**extra, "final_logit_softcapping": 5.0}
    config = getattr(transformers, config_name)(**size, num_attention_heads=4, num_key_value_heads=2, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    prompts, answers = [5, 9, 3, 7], [4, 2, 6, 1]
    length = max(p + a for p, a in zip(prompts, answers, strict=True)) + 1
    ids = torch.randint(2, 100, (4, length))
    attention = torch.zeros(4, length, dtype=torch.long)
    completion = torch.zeros(4, length, dtype=torch.long)
    for row, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        attention[row, : p + a] = 1
        completion[row, p : p + a] = 1

    def answer_logps(logits, ids, completion):
        logps = selective_log_softmax(logits[:, :-1], ids[:, 1:]) * completion[:, 1:]
        return logps.sum(dim=1)

    with torch.no_grad():
        expected = answer_logps(model(input_ids=ids, attention_mask=attention).logits, ids, completion)
        inputs = {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}
        with completion_logits.compact(
            inputs, [("input_ids", "completion_mask")], [model], lambda m: m
        ) as small:
            assert small is not None
            by_name = model(input_ids=small["input_ids"], attention_mask=attention).logits
            positional = model(small["input_ids"], attention_mask=attention).logits
    assert by_name.shape[1] == positional.shape[1] == max(answers) + 1
    for logits in (by_name, positional):
        got = answer_logps(logits, small["input_ids"], small["completion_mask"])
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def pair_loss_grads_metrics(trainer, batch, windows: bool):
    """CPO's or ORPO's loss, gradients and logged metrics for `batch`, through gym's windows or TRL's
    forward, and the (rows, positions) of each call of the LM head."""
    trainer._gym_windows = windows
    trainer.model.zero_grad()
    widths: list[tuple[int, int]] = []
    body: list[tuple[int, int]] = []
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    handles = [
        unwrapped.get_output_embeddings().register_forward_hook(
            lambda m, args, out: widths.append(tuple(out.shape[:2]))
        ),
        unwrapped.get_input_embeddings().register_forward_hook(
            lambda m, a, out: body.append(tuple(out.shape[:2]))
        ),
    ]
    try:
        loss, metrics = trainer.get_batch_loss_metrics(trainer.model, batch)
    finally:
        for handle in handles:
            handle.remove()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, metrics, widths, body


@pytest.mark.parametrize(
    ("finetuning_type", "settings"),
    [
        ("full", {}),
        ("lora", {}),
        ("full", {"sft_loss_weight": 0.5}),
        ("full", {"gradient_checkpointing": True}),
        ("full", {"method": "orpo"}),
        ("lora", {"method": "orpo"}),
        ("full", {"method": "orpo", "gradient_checkpointing": True}),
    ],
    ids=["simpo", "lora", "nll", "checkpointing", "orpo", "orpo_lora", "orpo_checkpointing"],
)
def test_gyms_simpo_and_orpo_equal_trls_forward(tmp_path, finetuning_type, settings):
    method = settings.pop("method", "simpo")
    trainer, batch = build(tmp_path, finetuning_type, "live", method=method, **settings)
    ours = pair_loss_grads_metrics(trainer, batch, windows=True)
    assert trainer._gym_windows, "gym-tiny's head output is its logits: the windows stay on"
    theirs = pair_loss_grads_metrics(trainer, batch, windows=False)

    pairs = batch["chosen_input_ids"].shape[0]
    length = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])
    assert theirs[3] == [(2 * pairs, length)]
    if method == "orpo":  # the SFT term reads the chosen rows whole; the rejected ones are cut
        assert ours[3] == [(pairs, length)]
    else:
        assert len(ours[3]) == 1 and ours[3][0][0] == 2 * pairs and ours[3][0][1] < length / 2
    # Each pair ran as one row, its prompt once (its padding kept: TRL's logits means read it).
    assert theirs[4] == [(2 * pairs, length)]
    assert len(ours[4]) == 1 and ours[4][0][0] == pairs and ours[4][0][1] < 2 * length * 0.9
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    assert ours[1].keys() == theirs[1].keys() and ours[1]
    for name, grad in ours[1].items():
        assert torch.allclose(grad, theirs[1][name], rtol=1e-4, atol=1e-6), name
    assert ours[2].keys() == theirs[2].keys()
    assert abs(ours[2]["rewards/margins"]) > 1e-4
    assert (ours[2]["nll_loss"] > 0) == ("sft_loss_weight" in settings or method == "orpo")
    for key, value in ours[2].items():  # the logits' means (every position, vocabulary) included
        assert value == pytest.approx(theirs[2][key], rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize("method", ["simpo", "orpo"])
def test_simpo_and_orpo_keep_trls_forward_for_a_model_that_changes_its_heads_output(tmp_path, method):
    """Softcapped or scaled logits (Gemma 2, Cohere, Granite) have no mean from the hidden states: the
    first batch shows it, and that batch and every later one go through TRL's forward."""
    trainer, batch = build(tmp_path, "full", "live", method=method)
    model = trainer.model
    softcap = lambda m, args, out: out.__setitem__("logits", 5 * torch.tanh(out.logits / 5))  # noqa: E731
    handle = model.register_forward_hook(softcap)
    try:
        theirs = pair_loss_grads_metrics(trainer, batch, windows=False)
        trainer._gym_windows = True
        ours = pair_loss_grads_metrics(trainer, batch, windows=True)
        assert not trainer._gym_windows
        again = pair_loss_grads_metrics(trainer, batch, windows=trainer._gym_windows)
    finally:
        handle.remove()
    assert len(ours[3]) == 2 and ours[3][0] != ours[3][1] == theirs[3][0], "the probe, then TRL's forward"
    assert again[3] == theirs[3]
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    for key, value in ours[2].items():
        assert value == pytest.approx(theirs[2][key], rel=1e-4, abs=1e-5), key


def pair_batch(vocab: int = 100):
    """Two DPO pairs as TRL's collator lays them out: chosen rows, then rejected rows, right-padded."""
    prompts, chosen, rejected = [5, 9], [4, 2], [3, 6]
    g = torch.Generator().manual_seed(1)
    rows = []
    for p, c, r in zip(prompts, chosen, rejected, strict=True):
        prompt = torch.randint(2, vocab, (p,), generator=g)
        rows.append(
            (prompt, torch.randint(2, vocab, (c,), generator=g), torch.randint(2, vocab, (r,), generator=g))
        )
    sequences = [(pr, c) for pr, c, _ in rows] + [(pr, r) for pr, _, r in rows]
    length = max(len(p) + len(a) for p, a in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    attention, completion = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (p, a) in enumerate(sequences):
        ids[row, : len(p) + len(a)] = torch.cat([p, a])
        attention[row, : len(p) + len(a)] = 1
        completion[row, len(p) : len(p) + len(a)] = 1
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def answer_logps(logits, ids, completion):
    from trl.trainer.utils import selective_log_softmax

    return (selective_log_softmax(logits[:, :-1], ids[:, 1:]) * completion[:, 1:]).sum(dim=1)


def shared_call(model, **kwargs):
    """`pair_batch`'s answers' log-probs from the model's own rows and through `compact(pairs=True)`
    (with `kwargs` beside the ids), and the (rows, tokens) the second call ran through the model."""
    inputs = pair_batch()
    ids, attention, completion = inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"]
    body: list[tuple[int, int]] = []
    handle = model.get_input_embeddings().register_forward_hook(
        lambda m, a, out: body.append(tuple(out.shape[:2]))
    )
    try:
        with torch.no_grad():
            expected = answer_logps(model(input_ids=ids, attention_mask=attention).logits, ids, completion)
            with completion_logits.compact(
                inputs, [("input_ids", "completion_mask")], [model], lambda m: m, pairs=True
            ) as small:
                assert small is not None
                logits = model(input_ids=small["input_ids"], attention_mask=attention, **kwargs).logits
    finally:
        handle.remove()
    return expected, answer_logps(logits, small["input_ids"], small["completion_mask"]), body[-1]


@pytest.mark.parametrize("family", ["llama", "llama_eager", *ARCHITECTURES, "gemma2_wide", "gemma3_wide"])
def test_every_registry_family_runs_each_pair_once_with_the_same_log_probs(family):
    """Shared rows ([prompt, chosen, rejected], the rejected answer's positions restarting after the
    prompt, a 4D mask hiding the chosen answer from it) give each answer the log-probs of its own row,
    on config-built tiny models of the registry's families; SDPA's bool mask and eager's additive one.
    The Gemmas' sliding window of 4 tokens is shorter than the shared rows: they keep TRL's rows (a
    custom mask would bypass the window); with a window of 64 ("_wide") they share too."""
    import transformers

    base = family.removesuffix("_wide").removesuffix("_eager")
    config_name, model_name, extra = ARCHITECTURES.get(base, ("LlamaConfig", "LlamaForCausalLM", {}))
    if family.endswith("_wide"):
        extra = {**extra, "sliding_window": 64, "final_logit_softcapping": 5.0}
    size = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    config = getattr(transformers, config_name)(**size, num_attention_heads=4, num_key_value_heads=2, **extra)
    if family.endswith("_eager"):
        config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    expected, got, body = shared_call(model)
    if base in ("gemma2", "gemma3") and not family.endswith("_wide"):
        assert body == tuple(pair_batch()["input_ids"].shape), "TRL's rows"
    else:
        assert body == (2, 9 + 2 + 6), "one row per pair, as long as the longest prompt + answers"
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_shared_rows_layout():
    from gym.train import shared_prompt

    inputs = pair_batch()
    shared = shared_prompt.share(inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"])
    assert shared is not None
    ids = inputs["input_ids"]
    # Pair 1: prompt of 9, chosen of 2, rejected of 6: [prompt, chosen, rejected], 17 tokens (the widest).
    assert shared.ids.shape == (2, 17)
    assert torch.equal(shared.ids[1], torch.cat([ids[1, :11], ids[3, 9:15]]))
    assert shared.positions[1].tolist() == [*range(11), *range(9, 15)]
    allowed = shared.allowed[1, 0]
    assert allowed[12, :9].all() and not allowed[12, 9:11].any(), (
        "the rejected answer sees the prompt, not chosen"
    )
    assert allowed[12, 11:13].all() and not allowed[12, 13:].any()
    assert allowed[10, :11].all() and not allowed[10, 11:].any()
    # Pair 0 (prompt 5, chosen 4, rejected 3 = 12 tokens) is padded to 17: padding is never a key.
    assert not shared.allowed[0, 0, :, 12:].any()
    eager = shared.mask("eager")
    assert eager.dtype == torch.float32 and torch.equal(eager == 0, shared.allowed)
    # TRL's row 3 (pair 1's rejected row) position 9 (its first answer token) is shared position 11.
    assert shared.locate(torch.tensor([[8, 9], [8, 9], [8, 9], [8, 9]])).tolist() == [
        [8, 9],
        [8, 9],
        [12, 13],
        [8, 11],
    ]


def test_rows_that_cannot_share_a_prompt_stay_as_they_are():
    from gym.train import shared_prompt

    inputs = pair_batch()
    ids, attention, completion = inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"]
    assert shared_prompt.share(ids, attention, completion) is not None
    other = ids.clone()
    other[3, 0] = (other[3, 0] + 1) % 100
    assert shared_prompt.share(other, attention, completion) is None, "a pair whose prompts differ"
    assert shared_prompt.share(ids.flip(1), attention.flip(1), completion.flip(1)) is None, "left padding"
    assert shared_prompt.share(ids[:3], attention[:3], completion[:3]) is None, "an odd number of rows"
    gap = completion.clone()
    gap[1, 10] = 0  # row 1: prompt of 9, answer at 9-10
    assert shared_prompt.share(ids, attention, gap) is None, "an answer that stops before its row does"

    class Config:
        _attn_implementation = "sdpa"
        sliding_window = None

    class Model:
        config = Config()

        def forward(self, input_ids, attention_mask=None, position_ids=None): ...

    class Alibi(Model):
        def forward(self, input_ids, attention_mask=None): ...  # positions from the 2D mask (Bloom, MPT)

    model = Model()
    assert shared_prompt.fits(model, 17)
    assert not shared_prompt.fits(Alibi(), 17), "a model whose positions don't come from position_ids"
    model.config.sliding_window = 16
    assert not shared_prompt.fits(model, 17), "a sliding window shorter than the shared rows"
    model.config.sliding_window, model.config._attn_implementation = None, "flash_attention_2"
    assert not shared_prompt.fits(model, 17), "an attention that builds its own mask"


def test_a_call_with_inputs_laid_out_by_row_keeps_trls_rows():
    """Position ids, token types or images passed beside the ids follow TRL's rows: no shared rows."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    attention = pair_batch()["attention_mask"]
    expected, got, body = shared_call(model, position_ids=(attention.cumsum(dim=1) - 1).clamp(min=0))
    assert body == tuple(attention.shape)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_shared_rows_can_keep_each_rows_padding():
    """With `padding`, every position of TRL's rows has its place: a row's padding follows its answer,
    at the positions it has in its row, sees that row's tokens and is no one's key."""
    from gym.train import shared_prompt

    inputs = pair_batch()  # rows of 15: pair 0 prompt 5, chosen 4 (+6 padding), rejected 3 (+7)
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    shared = shared_prompt.share(ids, attention, inputs["completion_mask"], padding=True)
    assert shared is not None and shared.ids.shape == (2, 5 + 10 + 10)
    assert torch.equal(shared.ids[0], torch.cat([ids[0], ids[2, 5:]]))
    assert shared.positions[0].tolist() == [*range(15), *range(5, 15)]
    allowed = shared.allowed[0, 0]
    assert not allowed[:, 9:15].any() and not allowed[:, 18:].any(), "padding is no one's key"
    assert allowed[12, :9].all(), "the chosen row's padding sees its row"
    assert allowed[20, :5].all() and allowed[20, 15:18].all() and not allowed[20, 5:15].any()
    everywhere = torch.arange(15).expand(4, -1)
    located = shared.locate(everywhere)
    assert located[0].tolist() == list(range(15)) and located[2].tolist() == [*range(5), *range(15, 25)]
