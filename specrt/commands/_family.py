"""`specrt generate`'s flags against a model family other than LlamaGen's, through the Family
interface alone (runtime/families: its methods, sampling keys, conditions, prompt options).

Flags mean what they mean for LlamaGen where they apply (--class, --seed, --out, --cfg-scale,
--temperature, --param, --stats, --save-tokens, --tokens-only, and the torch backend's options its
PyTorch pipeline takes: Family.torch_options, e.g. --device and --loop for the continuous demo,
checked as LlamaGen's are); the ones that do not (sampling keys the family lacks, prompts,
checkpoints, the torch options it does not take, any of them with a BUNDLE) are refused in one line
before the model loads. Family-specific sampling keys go through --param (the continuous family's
cfg_schedule: --param cfg_schedule=linear). A Hugging Face checkpoint directory (the unified
family on PyTorch) runs alone: check_hf_checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from specrt import validation
from specrt.commands._checkpoint_flags import CheckpointFlags
from specrt.commands._generate_flags import (Drawing, ModelFlags, RunFlags, SamplingFlags,
                                             refuse_torch_flags_on_a_bundle)
from specrt.errors import SpecrtError
from specrt.runtime.family import Family


def refused_prompt_options(family: Family, drawing: Drawing) -> dict[str, bool]:
    """The refused-flag entries of --negative-prompt / --no-prompt-suffix for `family` (refuse's
    {flag: given?}): they shape a CFG row that is a prompt, which only some families have."""
    applies = family.negative_prompts
    return {"--negative-prompt": drawing.negative_prompt is not None and not applies,
            "--no-prompt-suffix": drawing.no_prompt_suffix and not applies}


def refuse(family: Family, method: str, refused: dict[str, Any]) -> None:
    """Before the model loads: SpecrtError naming the first flag in `refused` ({flag: given?})
    that was given, or a method the family does not run."""
    given = [flag for flag, value in refused.items() if value]
    if given:
        raise SpecrtError(f"{given[0]} does not apply to a {family.description} model")
    if method not in family.methods:
        reason = family.refused_methods.get(method)
        if reason:
            raise SpecrtError(reason)
        from specrt.runtime.family_registry import where_method_runs

        raise SpecrtError(f"method {method!r}: a {family.description} model runs {', '.join(family.methods)}"
                          + where_method_runs(method, family.name))


def check_flags(family: Family, bundle: Optional[Path], method: str, seed: int, drawing: Drawing, models: ModelFlags,
                checkpoint: CheckpointFlags, sampling: SamplingFlags, run: RunFlags,
                given: Callable[[str], bool]) -> None:
    """Every flag against a BUNDLE or demo of `family` (not LlamaGen's), before the model loads:
    one line naming the first that does not apply. `given(name)`: whether the flag of parameter
    `name` was typed (its default otherwise)."""
    if models.demo is not None and (bundle or models.checkpoints):
        raise SpecrtError("--demo picks an embedded demo: give it without a BUNDLE or checkpoints")
    takes = family.torch_options
    refused = {"--top-k": sampling.top_k is not None and "top_k" not in family.sampling_keys,
               "--top-p": sampling.top_p is not None and "top_p" not in family.sampling_keys,
               "--prompt": drawing.prompts and not family.takes_prompts,
               "--class": drawing.class_ids and family.takes_prompts,
               "--captions": drawing.captions_path, "--text-encoder": models.text_encoder,
               "--target/--draft/--vq": models.checkpoints,
               "--device": run.device is not None and run.device.strip().lower() != "cpu" and "device" not in takes,
               "--max-window": given("max_window") and "max_window" not in takes,
               "--compile/--no-compile": given("compile_step") and "compile" not in takes,
               "--loop": given("loop") and "loop" not in takes,
               **refused_prompt_options(family, drawing),
               **{name: True for name in checkpoint.given()}}
    validation.seed(seed, "--seed")
    refuse(family, method, refused)
    if family.takes_prompts and not drawing.prompts:
        raise SpecrtError(f"a {family.description} model draws what a prompt says: give --prompt \"...\" (repeatable)")
    if bundle is None and run.backend not in (None, "torch"):
        raise SpecrtError(f"--backend {run.backend} needs a BUNDLE: export the demo with `specrt export --demo "
                          f"{models.demo} --out DIR`")
    if bundle is not None:
        refuse_torch_flags_on_a_bundle(run.device, run.backend, run.loop, given)
    validation.torch_device(run.device)


def check_hf_checkpoint(family: Family, bundle: Optional[Path], method: str, seed: int, drawing: Drawing,
                        models: ModelFlags, checkpoint: CheckpointFlags, run: RunFlags) -> None:
    """`specrt generate --target HF_DIR [--draft HF_DIR] --prompt ...` (the unified `family` on
    PyTorch): every flag checked before the checkpoint loads."""
    if bundle or models.demo or drawing.captions_path or models.text_encoder or checkpoint.given():
        raise SpecrtError("a Hugging Face checkpoint directory runs alone: drop the BUNDLE, --demo, --captions, "
                          "--text-encoder and the LlamaGen size flags")
    if models.draft is not None and not models.draft.is_dir():
        raise SpecrtError(f"--draft {models.draft} must be a Hugging Face directory like --target")
    validation.seed(seed, "--seed")
    refuse(family, method, {"--class": drawing.class_ids})
    if not drawing.prompts:
        raise SpecrtError(f"a {family.description} model draws what a prompt says: give --prompt \"...\" (repeatable)")
    validation.torch_device(run.device)
    if run.backend not in (None, "torch"):
        raise SpecrtError(f"--backend {run.backend}: a Hugging Face checkpoint directory runs on PyTorch; export it "
                          "(`specrt export --target DIR`) to run it on onnxruntime")
