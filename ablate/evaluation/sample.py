"""`ablate sample RUN_DIR`: text from a run's model, with the run's own tokenizer.

The prompt is prefilled into a KV cache (ablate/model/kv_cache.py), then each step runs one new
token per sample through the model. `temperature` 0 is greedy (argmax); otherwise softmax of
logits / temperature, over the `top_k` most likely tokens when given, drawn from a generator
seeded with `seed` (the same seed, prompt and number of samples give the same text). Only the
tokenizer's ids are drawn (the model's vocab may be padded past them). A sample ends at the
tokenizer's end-of-text token or after `max_new_tokens`.

A prompt longer than the run's training length (train.seq_len) keeps its last train.seq_len
tokens; a learned position table (model.max_seq_len rows) ends generation when prompt and text
fill it. Each is said in one notice line. Nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ablate.errors import ConfigError

DEFAULT_PROMPT = "\n"  # the start of a line: every tokenizer has it, and text follows it


@dataclass(frozen=True)
class SampleOptions:
    prompt: Optional[str] = None  # None: DEFAULT_PROMPT
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: Optional[int] = None
    seed: int = 0
    num_samples: int = 1
    step: Optional[int] = None  # the checkpoint's step (None: the newest)

    def check(self) -> None:
        """ConfigError (one line) for a value that cannot sample."""
        if not self.temperature >= 0:  # also NaN
            raise ConfigError(f"--temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k must be >= 1 (or left out: every token), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {self.num_samples}")
        if self.prompt == "":
            raise ConfigError("--prompt is empty: give some text, or leave it out to start from a newline")


@dataclass
class Samples:
    prompt: str  # the prompt the model saw (after any cut)
    texts: list[str]  # each sample's new text, without the prompt
    tokens: list[list[int]]  # each sample's new token ids (with its end-of-text token, if drawn)
    step: int  # the checkpoint's step
    notices: list[str] = field(default_factory=list)  # one line each: prompt cut, table full


@dataclass
class Generated:
    tokens: list[list[int]]
    table_full: bool  # stopped by the learned table's limit, before max_new_tokens


def pick(logits, temperature: float, top_k: Optional[int], generator):
    """Next tokens (B,) from logits (B, V)."""
    import torch

    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)


def generate(model, prompt: list[int], opts: SampleOptions, vocab: int, eot: int) -> Generated:
    """opts.num_samples continuations of `prompt` (token ids): a prefill, then one token per
    sample per step through the KV cache. `vocab`: ids >= it are never drawn."""
    import torch

    from ablate.model.kv_cache import KVCache

    limit = model.pos.max_positions
    room = opts.max_new_tokens if limit is None else min(opts.max_new_tokens, limit - len(prompt))
    B, generator = opts.num_samples, torch.Generator().manual_seed(opts.seed)
    cache = KVCache.for_model(model, batch=B, capacity=len(prompt) + room)
    out, done = [], torch.zeros(B, dtype=torch.bool)
    with torch.no_grad():
        # the prefill's last position alone: no unembedding of every prompt position
        logits = model.decode(torch.tensor([prompt] * B), cache, last=True)[:, -1]  # (B, V)
        for _ in range(room):
            logits[:, vocab:] = float("-inf")  # the model's padding ids are no tokens
            nxt = pick(logits, opts.temperature, opts.top_k, generator).masked_fill(done, eot)  # (B,)
            out.append(nxt)
            done |= nxt == eot
            if done.all() or len(out) == room:
                break
            logits = model.decode(nxt[:, None], cache)[:, -1]  # one new token per sample
    rows = torch.stack(out, dim=1).tolist() if out else [[] for _ in range(B)]
    tokens = [row[:row.index(eot) + 1] if eot in row else row for row in rows]
    return Generated(tokens, table_full=room < opts.max_new_tokens and not bool(done.all()))


def prompt_ids(tok, text: str, seq_len: int, notices: list) -> list[int]:
    ids = tok.encode(text)
    if len(ids) > seq_len:
        notices.append(f"notice: the prompt is {len(ids)} tokens, longer than the run's training length "
                       f"(train.seq_len={seq_len}): using its last {seq_len}")
        ids = ids[-seq_len:]
    return ids


def sample_run(run_dir, opts: SampleOptions) -> Samples:
    """Samples from a run's checkpoint. Raises AblateError (one line) for bad options or a run
    without usable weights (ablate/run/trained.py)."""
    import torch

    from ablate.data.tokenizers import build_tokenizer
    from ablate.run.trained import load_run_model

    opts.check()
    loaded = load_run_model(Path(run_dir), opts.step)
    threads = loaded.cfg.train.get("threads") or 0  # as the run trained (0: torch's default)
    if threads > 0:
        torch.set_num_threads(threads)
    tok, notices = build_tokenizer(loaded.tokenizer), []
    ids = prompt_ids(tok, DEFAULT_PROMPT if opts.prompt is None else opts.prompt, loaded.cfg.train.seq_len,
                     notices)
    out = generate(loaded.model, ids, opts, tok.vocab_size, tok.eot_id)
    if out.table_full:
        notices.append(f"notice: stopped after {max(map(len, out.tokens))} new tokens: pos={loaded.spec.pos} "
                       f"places at most model.max_seq_len={loaded.spec.max_seq_len} tokens (prompt and text); "
                       "a shorter --prompt leaves more room")
    return Samples(tok.decode(ids), [tok.decode(t) for t in out.tokens], out.tokens, loaded.step, notices)
