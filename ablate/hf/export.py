"""`ablate export RUN_DIR OUT_DIR`: a run's checkpoint as a save_pretrained folder, with the
special tokens and tokenizer files of the run's tokenizer, smoke-tested by generating from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ablate.errors import CheckpointError, ConfigError
from ablate.hf.convert import to_hf_model
from ablate.hf.families import FAMILIES, transformers_module
from ablate.hf.tokenizer import eot_id, hf_tokenizer
from ablate.run.trained import load_run_model
from ablate.evaluation.sample import SampleOptions, generate


def generation_check(model, out_dir, prompt: list, eos: int, n: int = 8) -> list:
    """Load the saved folder with AutoModelForCausalLM, generate `n` tokens greedily and compare
    them with our model's greedy tokens (HF stops at eos: ours are cut there too)."""
    import torch

    transformers = transformers_module()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out_dir).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    theirs = out[0, len(prompt):].tolist()
    greedy = SampleOptions(max_new_tokens=n, temperature=0)  # every id may be drawn, as in HF
    ours = generate(model, prompt, greedy, vocab=model.spec.vocab_size, eot=eos).tokens[0]
    if theirs != ours:
        raise CheckpointError(f"generation smoke test failed: the exported model generates {theirs}, "
                              f"the run's model {ours} (greedy, from {prompt})")
    return theirs


@dataclass
class Export:
    path: Path
    notes: list  # one line each: special tokens, tokenizer, generation check


def export(run_dir, out_dir, family: Optional[str] = None, check: bool = True) -> Export:
    """A run's model as a Hugging Face folder: config.json + safetensors, special tokens from the
    run's tokenizer, its tokenizer files where HF represents it, and (check) a generation smoke
    test of the saved folder. Raises AblateError (nothing is left in out_dir then)."""
    import shutil

    if family is not None and family not in FAMILIES:  # before the run's model is loaded
        raise ConfigError(f"unknown --family '{family}'; choose one of {', '.join(FAMILIES.names())}")
    loaded = load_run_model(run_dir)
    model, name = loaded.model, loaded.tokenizer
    eos = eot_id(name)
    transformers_module().utils.logging.disable_progress_bar()  # our lines, not loading bars
    hf = to_hf_model(model, family)  # refuses an architecture no family represents
    for target in (hf.config, hf.generation_config):
        target.bos_token_id = target.eos_token_id = target.pad_token_id = eos
    tok, tok_note = hf_tokenizer(name, context=model.spec.max_seq_len)
    out = Path(out_dir)
    existed = out.exists()
    notes = [f"special tokens: bos = eos = pad = {eos} ({name}'s end-of-text)", tok_note]
    try:
        hf.save_pretrained(out)
        if tok is not None:
            tok.save_pretrained(out)
        if check:
            prompt = tok.encode("The") if tok is not None else [eos]
            tokens = generation_check(model, out, prompt, eos)
            notes.append(f"generation check: AutoModelForCausalLM from {out} generates the run's "
                         f"greedy tokens ({len(tokens)} from {prompt})")
    except BaseException:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)  # nothing half-written
        raise
    return Export(out, notes)
