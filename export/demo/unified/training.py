"""Training the unified demo: a Chameleon-architecture target and draft on the captioned digits.

    python -m specrt.export.demo.unified.training --out export/demo/unified/weights [--seed 0]

Why this data path: the images, their 25 shifted copies, their VQ codes and their captions are
the t2i demo's (the same VQ tokenizes them, the same measured attributes caption them), so the
two demos differ only in the generator: one vocabulary for text and image tokens, Lumina-mGPT's
sequence layout (vocabulary.training_sequence), transformers' Chameleon classes. Each row is
Lumina-mGPT's conversation: `<s>` + template(caption) + `<reserved08706>`, then the assistant turn
`<racm3:break>` + two size tokens + 8 rows of (8 codes + row end) + `<eoss>` + `<reserved08706>`,
learnt with next-token cross-entropy on the assistant turn only (Lumina's labels). A share of
rows drops the human turn and starts at the image-start token, which is the input of Lumina's
CFG branch, so classifier-free guidance works. The loss reads logits from the trunk and lm_head
(transformers' forward masks image tokens). Seeded: same seed and torch build, same weights.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from specrt.lazy import require

torch = require("torch", "unified demo training")
transformers = require("transformers", "unified demo training")

from specrt import __version__  # noqa: E402
from specrt.export.demo.configs import Schedule  # noqa: E402
from specrt.export.demo.dataset import HELD_OUT_FRACTION, SPLIT_SEED, DigitsSplit, load_split  # noqa: E402
from specrt.export.demo.store import round_to_storage  # noqa: E402
from specrt.export.demo.t2i.captions import (  # noqa: E402
    ATTRIBUTES, MENTION_PROBABILITY, TEMPLATES, AttributeBins, default_prompts, parse_prompt,
)
from specrt.export.demo.t2i.evaluator import predict, prompt_following  # noqa: E402
from specrt.export.demo.t2i.training import CaptionedImages  # noqa: E402
from specrt.export.demo.training import StageTimer, optimise, tokenize, tokenize_shifted  # noqa: E402
from specrt.export.demo.unified import configs, store  # noqa: E402
from specrt.export.demo.unified import vocabulary as voc  # noqa: E402
from specrt.export.demo.unified.sampling import generate, image_nll, logits_of, right_padded, sequence_loss  # noqa: E402

CFG_SWEEP = (1.0, 2.0, 3.0, 4.0)  # Lumina-mGPT samples at 3-4; 1 is no guidance
QUALITY_REPEATS = 2               # the 80 default prompts twice: 160 samples per setting
ACCEPTANCE_DRAFT_LEN = 4


def parameters(model) -> int:
    """The language model's parameters (the untrained VQ placeholder left out)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.vqmodel."))


def batch_rows(tokenizer, captions: Sequence[Optional[str]], codes: np.ndarray) -> list[tuple[list[int], int]]:
    """Training rows (vocabulary.training_sequence) of images `codes` under `captions` (None: unconditional)."""
    prompts = iter(voc.encode_prompts(tokenizer, [c for c in captions if c is not None]))
    return [voc.training_sequence(next(prompts) if c is not None else None, row) for c, row in zip(captions, codes)]


def train_model(config, data: CaptionedImages, tokenizer, codes: np.ndarray, sequence_images: np.ndarray,
                schedule: Schedule, caption_dropout: float, seed: int, desc: str,
                held_out: tuple[list[str], np.ndarray] | None = None, progress: bool = True):
    """A ChameleonForConditionalGeneration trained from scratch (its VQ placeholder frozen)."""
    torch.manual_seed(seed)
    model = transformers.ChameleonForConditionalGeneration(config)
    model.model.vqmodel.requires_grad_(False)  # AdamW skips parameters without gradients

    def loss_fn(step: int, rng: np.random.Generator):
        idx = rng.integers(0, len(codes), schedule.batch_size)
        texts = data.random_texts(sequence_images[idx], rng)
        drop = rng.random(len(idx)) < caption_dropout
        captions = [None if d else t for t, d in zip(texts, drop)]
        loss = sequence_loss(model, *right_padded(batch_rows(tokenizer, captions, codes[idx])))
        return loss, {"loss": loss.item()}

    metrics = optimise(model, schedule, loss_fn, seed, desc, progress)
    model = round_to_storage(model.eval())  # what save_model writes: metrics describe the shipped weights
    metrics["parameters"] = parameters(model)
    if held_out is not None:
        captions, held_codes = held_out
        nll = image_nll(model, tokenizer, captions, held_codes)
        metrics["held_out_nll"], metrics["held_out_stream_nll"] = nll["codes"], nll["stream"]
        metrics["held_out_unconditional_nll"] = image_nll(model, tokenizer, [None] * len(held_codes), held_codes)["codes"]
    return model, metrics


# ---- quality -------------------------------------------------------------------------------------

@torch.no_grad()
def prompt_following_of(target, tokenizer, vq, evaluator, prompts: Sequence[str], cfg_scale: float,
                        temperature: float, top_k: int, seed: int) -> dict:
    """Sample one image per prompt (sampling.generate), decode with the demo VQ, read with the t2i
    evaluator: the share whose digit (and each named attribute) is the prompt's."""
    codes = generate(target, tokenizer, prompts, cfg_scale, temperature, top_k, seed)
    images = vq.decode_codes(torch.from_numpy(codes).long()).clamp(-1, 1).numpy()
    return prompt_following(predict(evaluator, images), [parse_prompt(p) for p in prompts])


@torch.no_grad()
def expected_acceptance(target, draft, tokenizer, captions: Sequence[str], codes: np.ndarray,
                        cfg_scale: float) -> float:
    """Mean Σ_x min(p(x), q(x)) over the image-code positions of teacher-forced held-out images:
    the probability that speculative sampling accepts one drafted code, both models under the
    same CFG (over the image tokens only, as the grammar samples)."""
    image_ids = slice(voc.FIRST_IMAGE_ID, voc.FIRST_IMAGE_ID + voc.CODEBOOK_SIZE)

    def probs(model, rows):
        ids, labels = right_padded(rows)
        logits, _ = logits_of(model, ids, use_cache=False)
        return logits, labels

    def guided(model):
        cond, labels = probs(model, batch_rows(tokenizer, captions, codes))
        uncond, uncond_labels = probs(model, batch_rows(tokenizer, [None] * len(codes), codes))
        out = []
        for i in range(len(codes)):  # align each row's code positions (the prompts differ in length)
            at = torch.nonzero((labels[i, 1:] >= voc.FIRST_IMAGE_ID) & (labels[i, 1:] < image_ids.stop))[:, 0]
            uat = torch.nonzero((uncond_labels[i, 1:] >= voc.FIRST_IMAGE_ID) & (uncond_labels[i, 1:] < image_ids.stop))[:, 0]
            c, u = cond[i, at, image_ids], uncond[i, uat, image_ids]
            out.append(torch.softmax(cfg_scale * (c - u) + u, -1))
        return torch.stack(out)

    p, q = guided(target), guided(draft)
    return float(torch.minimum(p, q).sum(-1).mean())


def quality_summary(target, draft, tokenizer, split: DigitsSplit, held_captions: list[str], held_codes: np.ndarray,
                    seed: int = 0, progress: bool = True) -> dict:
    """AR prompt following at each CFG scale of the sweep (and greedy at the chosen one), the
    defaults it picks, and the draft's expected acceptance under them."""
    vq, evaluator = store.load_vq(), store.load_evaluator()
    prompts = default_prompts() * QUALITY_REPEATS
    defaults = dict(configs.SAMPLING_DEFAULTS)
    sweep = {}
    for scale in CFG_SWEEP:
        sweep[str(scale)] = prompt_following_of(target, tokenizer, vq, evaluator, prompts, scale,
                                                defaults["temperature"], defaults["top_k"], seed)
        if progress:
            print(f"cfg {scale}: {json.dumps({k: round(v, 3) for k, v in sweep[str(scale)].items()})}")
    # the default: the scale whose samples show most of what their prompts name (`words`: the digit
    # and every named attribute; the digit alone saturates near 0.99 from cfg 2 on), the smaller on a tie
    chosen = float(max(sweep, key=lambda s: (round(sweep[s]["words"], 6), -float(s))))
    defaults["cfg_scale"] = chosen
    greedy = prompt_following_of(target, tokenizer, vq, evaluator, prompts[:len(prompts) // QUALITY_REPEATS],
                                 chosen, 0.0, 0, seed)
    evaluator_real = prompt_following(predict(evaluator, split.held_out_images),
                                      [parse_prompt(c) for c in held_captions])
    n = 64
    alpha = expected_acceptance(target, draft, tokenizer, held_captions[:n], held_codes[:n], chosen)
    gamma = ACCEPTANCE_DRAFT_LEN
    return {
        "sampler": "specrt.export.demo.unified.sampling.generate (transformers trunk + lm_head, Lumina-mGPT's CFG "
                   "and grammar)",
        "evaluator": "the t2i demo's (export/demo/t2i/weights/evaluator.safetensors)",
        "prompts": len(prompts),
        "sampling_defaults": defaults,
        "ar_prompt_following": sweep[str(chosen)],
        "cfg_sweep": sweep,
        "greedy_prompt_following": greedy,
        "greedy_prompts": len(prompts) // QUALITY_REPEATS,
        "real_prompt_following": evaluator_real,
        "draft_expected_acceptance": {
            "cfg_scale": chosen, "held_out_images": n, "alpha": alpha, "draft_len": gamma,
            "iid_mean_accepted_length": (1 - alpha ** (gamma + 1)) / (1 - alpha),
            "note": "per-token acceptance probability sum_x min(p, q) of the draft, teacher-forced on held-out "
                    "images; the accepted length assumes independent positions (specrt bench measures it)"},
    }


def held_out_set(split: DigitsSplit, bins: AttributeBins, vq) -> tuple[list[str], np.ndarray]:
    """The held-out images' canonical captions (every measured attribute named) and their codes."""
    held = CaptionedImages(None, split.held_out_labels, bins.labels(split.held_out_images, split.held_out_labels), 0)
    return held.full_texts(np.arange(len(split.held_out_labels))), tokenize(vq, split.held_out_images)


def evaluate_weights(root: str | Path, seed: int = 0, threads: int = 1, progress: bool = True) -> dict:
    """Re-run the quality check on a trained weights folder and rewrite its demo.json's `quality`
    and `sampling_defaults` (the weights are untouched): what --evaluate-only does."""
    torch.set_num_threads(threads)
    root = Path(root)
    config = store.demo_config(root)
    started = time.time()
    split = load_split()
    held_captions, held_codes = held_out_set(split, AttributeBins.from_dict(store.t2i_config()["attributes"]),
                                             store.load_vq())
    target, draft = store.load_model(store.target_dir(root)), store.load_model(store.draft_dir(root))
    quality = quality_summary(target, draft, store.load_tokenizer(store.target_dir(root)), split, held_captions,
                              held_codes, seed, progress)
    config["quality"], config["sampling_defaults"] = quality, dict(quality["sampling_defaults"])
    config["training"].setdefault("seconds", {})["quality"] = round(time.time() - started, 1)
    (root / store.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return config


# ---- the whole demo ----------------------------------------------------------------------------

def layout() -> dict:
    """The token layout demo.json records (names and ids)."""
    ids = voc.VOCAB
    return {
        "vocab_size": voc.VOCAB_SIZE,
        "specials": {t: ids[t] for t in voc.SPECIALS},
        "image_tokens": {"first_id": voc.FIRST_IMAGE_ID, "count": voc.CODEBOOK_SIZE,
                         "id_of_code": "first_id + code", "name_of_code": "IMGIMG + A..J per decimal digit + Z",
                         "examples": {str(c): voc.image_token(c) for c in (0, 7, 42, 511)}},
        "structural": {"image_start": [voc.IMAGE_START, ids[voc.IMAGE_START]],
                       "image_end": [voc.IMAGE_END, ids[voc.IMAGE_END]],
                       "end_of_turn": [voc.END_OF_TURN, ids[voc.END_OF_TURN]],
                       "row_end": [voc.ROW_END, ids[voc.ROW_END]],
                       "size_rows": [voc.SIZE, ids[voc.SIZE]], "size_cols": [voc.SIZE, ids[voc.SIZE]]},
        "size_tokens": "Lumina-mGPT's <reserved{8800+n:05d}> with n = token-grid side / 2 (its VQ's grid is 2n per "
                       "side); the 8x8 grid is n = 4 for rows and for columns",
        "first_word_id": ids[voc.text_words()[0]],
    }


def train_unified_demo(out_dir: str | Path | None, seed: int = 0, steps_scale: float = 1.0, threads: int = 1,
                       evaluate: bool = True, progress: bool = True, split: DigitsSplit | None = None) -> dict:
    """Train the target and the draft and (when out_dir is given) save them with demo.json;
    returns demo.json's content. steps_scale shortens every schedule (tests, smoke runs)."""
    torch.set_num_threads(threads)
    started = time.time()
    split = split if split is not None else load_split()
    schedule = configs.UnifiedTrainingConfig().scaled(steps_scale)
    timed = StageTimer()
    t2i = store.t2i_config()
    bins = AttributeBins.from_dict(t2i["attributes"])  # the t2i demo's thresholds: the same captions
    vq = store.load_vq()
    tokenizer = voc.build_tokenizer()
    codes, sequence_images = timed("tokenize", tokenize_shifted, vq, split.train_images,
                                   np.arange(len(split.train_labels)), schedule.max_shift, progress)
    data = CaptionedImages(None, split.train_labels, bins.labels(split.train_images, split.train_labels), 0)
    held_captions, held_codes = held_out_set(split, bins, vq)
    metrics = {}
    target, metrics["target"] = timed("target", train_model, configs.chameleon_config(configs.TARGET), data, tokenizer,
                                      codes, sequence_images, schedule.target, schedule.caption_dropout,
                                      seed * 100 + 2, "unified target", (held_captions, held_codes), progress)
    draft, metrics["draft"] = timed("draft", train_model, configs.chameleon_config(configs.DRAFT), data, tokenizer,
                                    codes, sequence_images, schedule.draft, schedule.caption_dropout,
                                    seed * 100 + 3, "unified draft", (held_captions, held_codes), progress)
    config = {
        "demo": "unified", "format": store.FORMAT, "version": store.VERSION,
        "architecture": "ChameleonForConditionalGeneration (Lumina-mGPT's conventions)",
        "files": {"target": store.TARGET_DIR, "draft": store.DRAFT_DIR,
                  "vq": {"demo": "t2i", "file": "vq.safetensors", "config": "the t2i demo's demo.json 'vq'"},
                  "evaluator": {"demo": "t2i", "file": "evaluator.safetensors"}},
        "sampling_defaults": dict(configs.SAMPLING_DEFAULTS),
        "grid": {"rows": voc.GRID, "cols": voc.GRID, "row_end": True, "image_vocab": voc.CODEBOOK_SIZE,
                 "image_size": voc.IMAGE_SIZE, "stream_len": voc.GRID * (voc.GRID + 1)},
        "prompt": {
            "template": voc.TEMPLATE, "width": voc.IMAGE_SIZE, "height": voc.IMAGE_SIZE,
            "conditional": "<s> + template(prompt) + <reserved08706> + <racm3:break> + <reserved08804> + "
                           "<reserved08804> (Lumina-mGPT's human turn with its end of turn, then the image prefix "
                           "the model emits; tokenizer.json puts <s> first)",
            "unconditional": "<racm3:break> + <reserved08804> + <reserved08804> (Lumina-mGPT's CFG branch: the "
                             "image-start token onward, no <s>, no text)",
            "after_stream": "<eoss> + <reserved08706> (end of image, end of turn: generation stops there)",
            "example_ids": voc.encode_prompts(tokenizer, ["a thin two"])[0],
            "unconditional_ids": voc.image_prefix_ids(),
        },
        "tokens": layout(),
        "captions": {"words": {name: list(map(list, pair)) for name, pair in ATTRIBUTES.items()},
                     "templates": list(TEMPLATES), "mention_probability": MENTION_PROBABILITY,
                     "attributes": "the t2i demo's demo.json 'attributes' (per-digit median thresholds)"},
        "dataset": {"name": "sklearn.datasets.load_digits", "image_size": voc.IMAGE_SIZE, "split_seed": SPLIT_SEED,
                    "held_out_fraction": HELD_OUT_FRACTION, "train_images": len(split.train_labels),
                    "held_out_images": len(split.held_out_labels), "tokenized_sequences": len(codes)},
        "models": {"target": vars(configs.TARGET), "draft": vars(configs.DRAFT),
                   "max_position_embeddings": configs.MAX_POSITIONS,
                   "vq_placeholder": dict(configs.VQ_PLACEHOLDER, note="transformers' class needs a ChameleonVQVAE "
                                          "(encoder only); untrained, unused: the t2i demo's VQ decodes")},
        "training": dict(schedule.to_dict(), seed=seed, steps_scale=steps_scale, init="random (from scratch)",
                         loss="next-token cross-entropy on the assistant turn: <racm3:break> (conditional rows), "
                              "size tokens, codes, row ends, <eoss>, <reserved08706>",
                         command=f"python -m specrt.export.demo.unified.training --out DIR --seed {seed}"),
        "metrics": metrics,
        "provenance": {"created_by": f"specrt {__version__}", "torch": torch.__version__,
                       "transformers": transformers.__version__, "python": platform.python_version(),
                       "threads": threads},
    }
    if out_dir is not None:
        _save(target, draft, config, Path(out_dir))
    if evaluate:
        quality = timed("quality", quality_summary, target, draft, tokenizer, split, held_captions, held_codes, seed,
                        progress)
        config["quality"] = quality
        config["sampling_defaults"] = dict(quality["sampling_defaults"])
    timed.seconds["total"] = round(time.time() - started, 1)
    config["training"]["seconds"] = timed.seconds
    if out_dir is not None:
        _save(target, draft, config, Path(out_dir))
    return config


def _save(target, draft, config: dict, out: Path) -> None:
    store.save_model(target, store.target_dir(out))
    store.save_model(draft, store.draft_dir(out))
    (out / store.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train the unified-vocabulary (Chameleon / Lumina-mGPT) demo.")
    parser.add_argument("--out", type=Path, required=True, help="weights folder to write (target/, draft/, demo.json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-scale", type=float, default=1.0, help="scale every schedule's steps (smoke runs)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-evaluate", action="store_true", help="skip the sampling quality check")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="train nothing: re-run the quality check on --out's weights and update its demo.json")
    args = parser.parse_args(argv)
    if args.evaluate_only:
        config = evaluate_weights(args.out, args.seed, args.threads)
        print(json.dumps({"quality": config["quality"]["ar_prompt_following"],
                          "sampling_defaults": config["sampling_defaults"]}, indent=2))
        return
    config = train_unified_demo(args.out, args.seed, args.steps_scale, args.threads, not args.no_evaluate)
    print(json.dumps({"metrics": config["metrics"], "seconds": config["training"]["seconds"],
                      "sampling_defaults": config["sampling_defaults"]}, indent=2))


if __name__ == "__main__":
    main()
