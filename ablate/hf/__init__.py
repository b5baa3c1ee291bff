"""Import and export Hugging Face `transformers` checkpoints, so ablated models can be evaluated
with HF tooling and HF models can be loaded into the ablation trainer. Needs transformers >= 5.

    to_hf(model)          -> (hf_config, state_dict)   our Transformer as an HF family
    to_hf_model(model)    -> an HF *ForCausalLM with our weights
    from_hf(hf_model)     -> Transformer                ModelSpec derived from the HF config
    export(run_dir, out_dir)                            a run's checkpoint -> save_pretrained folder
                                                        (`ablate export RUN_DIR OUT_DIR`)

    families.py   the families (gpt2, llama, qwen3, gemma2): requirements, config <-> spec
    weights.py    each family's weight map, as data
    convert.py    model <-> HF model through the weight maps
    tokenizer.py  the run's tokenizer as a tokenizer.json (transformers' TikTokenConverter)
    export.py     a run directory -> an HF folder, with a generation smoke test

torch and transformers are imported inside the functions (the CLI stays fast).
"""

from ablate.hf.convert import from_hf, spec_from_hf_config, to_hf, to_hf_model
from ablate.hf.export import Export, export, generation_check
from ablate.hf.families import FAMILIES, Family, family_for
from ablate.hf.tokenizer import EOT_IDS, EOT_TEXT, eot_id, hf_tokenizer
from ablate.run.trained import load_run_model  # a run's weights (ablate/run/trained.py), kept importable here

__all__ = ["EOT_IDS", "EOT_TEXT", "FAMILIES", "Export", "Family", "eot_id", "export", "family_for",
           "from_hf", "generation_check", "hf_tokenizer", "load_run_model", "spec_from_hf_config",
           "to_hf", "to_hf_model"]
