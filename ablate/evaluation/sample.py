"""`ablate sample RUN_DIR`: text from a run's model, with the run's own tokenizer.

The prompt is prefilled into a KV cache (ablate/model/kv_cache.py), then each step runs one new
token per sample through the model. `temperature` 0 is greedy (argmax); otherwise softmax of
logits / temperature, over the `top_k` most likely tokens when given, drawn from a generator
seeded with `seed` (the same seed, prompt and number of samples give the same text). Only the
tokenizer's ids are drawn (the model's vocab may be padded past them). A sample ends at the
tokenizer's end-of-text token or after `max_new_tokens`.

A prompt longer than the run's training length (train.seq_len) keeps its last train.seq_len
tokens; text that reaches past the training length reads positions the model never trained at;
a learned position table (model.max_seq_len rows) ends generation when prompt and text fill it.
Each is said in one notice line. The KV cache for every sample at full length is estimated
before it is allocated (ablate/evaluation/budget.py) and refused, with the figure, when it would
not fit; one sample's text can be streamed as it is drawn (TextStream). Nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ablate.errors import ConfigError
from ablate.train.threads import check_threads, use_threads

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
    threads: int = 0  # CPU threads (0: chosen from the cores free at start; ablate/train/threads.py)

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
        check_threads(self.threads)


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


def room_for(model, prompt: list[int], opts: SampleOptions) -> int:
    """New tokens a sample can have: max_new_tokens, or fewer where a learned table ends."""
    limit = model.pos.max_positions
    return opts.max_new_tokens if limit is None else min(opts.max_new_tokens, limit - len(prompt))


def check_memory(model, prompt: list[int], opts: SampleOptions, free: Optional[int] = None) -> None:
    """ConfigError (one line, with the figure) when the KV cache of every sample at full length
    (and the prefill) would not fit in the memory free, before anything is allocated."""
    from ablate.evaluation.budget import HEADROOM, check_fits, decode_bytes, free_bytes
    from ablate.terminal import human_bytes

    B, P, room = opts.num_samples, len(prompt), room_for(model, prompt, opts)
    free = free_bytes() if free is None else free
    need = decode_bytes(model.spec, B, P, P + room)
    if free is None or need is None or need * HEADROOM <= free:
        return
    base = decode_bytes(model.spec, B, P, P) or 0  # the prompt's cache and the prefill
    per_position = (need - base) / max(1, room)  # every sample's cache for one more token
    tokens = int((free / HEADROOM - base) // max(per_position, 1))
    samples = int(free / HEADROOM // max(need / B, 1))
    useful = tokens >= 1 and (B == 1 or tokens >= opts.max_new_tokens / 10)  # not 1 token for many samples
    fix = " or ".join(([f"at most {tokens:,} new tokens (--max-new-tokens)"] if useful else []) +
                      ([f"at most {samples:,} samples (--num-samples)"] if B > 1 and samples >= 1 else []))
    many = f" for {B:,} samples" if B > 1 else ""
    check_fits(need, f"--max-new-tokens {opts.max_new_tokens:,}{many}: a KV cache of {P + room:,} positions "
               f"({human_bytes(per_position / B)} each per sample)", f"ask for {fix or 'a shorter --prompt'}", free=free)


def generate(model, prompt: list[int], opts: SampleOptions, vocab: int, eot: int,
             on_step: Optional[Callable[[list[int]], None]] = None) -> Generated:
    """opts.num_samples continuations of `prompt` (token ids): a prefill, then one token per
    sample per step through the KV cache. `vocab`: ids >= it are never drawn. `on_step`: called
    with each step's new token of every sample, as it is drawn (streaming)."""
    import torch

    from ablate.model.kv_cache import KVCache

    room = room_for(model, prompt, opts)
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
            if on_step is not None:
                on_step(nxt.tolist())
            done |= nxt == eot
            if done.all() or len(out) == room:
                break
            logits = model.decode(nxt[:, None], cache)[:, -1]  # one new token per sample
    rows = torch.stack(out, dim=1).tolist() if out else [[] for _ in range(B)]
    tokens = [row[:row.index(eot) + 1] if eot in row else row for row in rows]
    return Generated(tokens, table_full=room < opts.max_new_tokens and not bool(done.all()))


class TextStream:
    """The first sample's text as its tokens arrive: each call gives the text added since the
    last one, held back while it ends inside a character (a byte of a multi-byte UTF-8 letter
    decodes as U+FFFD until the rest arrives)."""

    def __init__(self, tok, write: Callable[[str], None]):
        self.tok, self.write, self.tokens, self.shown, self.ended = tok, write, [], 0, False

    def __call__(self, step: list[int]) -> None:
        if self.ended:
            return
        self.tokens.append(step[0])
        self.ended = step[0] == self.tok.eot_id
        text = self.tok.decode(self.tokens)
        if not text.endswith("\ufffd") or self.ended:
            self.write(text[self.shown:])
            self.shown = len(text)

    def close(self) -> None:
        text = self.tok.decode(self.tokens)
        if len(text) > self.shown:
            self.write(text[self.shown:])
            self.shown = len(text)


def prompt_ids(tok, text: str, seq_len: int, notice: Callable[[str], None]) -> list[int]:
    ids = tok.encode(text)
    if len(ids) > seq_len:
        notice(f"notice: the prompt is {len(ids)} tokens, longer than the run's training length "
               f"(train.seq_len={seq_len}): using its last {seq_len}")
        ids = ids[-seq_len:]
    return ids


def past_training(loaded, prompt: list[int], opts: SampleOptions) -> Optional[str]:
    """A notice when prompt and text will reach past the training length (train.seq_len)."""
    seq_len, end = loaded.cfg.train.seq_len, len(prompt) + room_for(loaded.model, prompt, opts)
    if end <= seq_len:
        return None
    rows = (f" (pos={loaded.spec.pos}: rows of its table that training never updated)"
            if loaded.model.pos.max_positions is not None else "")  # a learned table, not a formula
    return (f"notice: past token {seq_len} (train.seq_len, the run's training length) the model reads positions "
            f"it never trained at{rows}; the text may degrade there")


def sample_run(run_dir, opts: SampleOptions, say: Optional[Callable[[str], None]] = None,
               stream: Optional[Callable[[str], None]] = None) -> Samples:
    """Samples from a run's checkpoint. Raises AblateError (one line) for bad options, a run
    without usable weights (ablate/run/trained.py) or a cache that would not fit in memory.
    `say`: each notice as it arises (they are in Samples.notices too); `stream`: the first
    sample's text as it is generated (one sample only)."""
    from ablate.data.tokenizers import build_tokenizer
    from ablate.run.trained import load_run_model

    opts.check()
    loaded = load_run_model(Path(run_dir), opts.step)
    tok, notices = build_tokenizer(loaded.tokenizer), []

    def notice(line: str) -> None:
        notices.append(line)
        if say is not None:
            say(line)

    ids = prompt_ids(tok, DEFAULT_PROMPT if opts.prompt is None else opts.prompt, loaded.cfg.train.seq_len, notice)
    check_memory(loaded.model, ids, opts)
    use_threads(opts.threads, "--threads N", say=notice)
    beyond = past_training(loaded, ids, opts)
    if beyond:
        notice(beyond)
    text = TextStream(tok, stream) if stream is not None and opts.num_samples == 1 else None
    if text is not None:
        stream(tok.decode(ids))
    out = generate(loaded.model, ids, opts, tok.vocab_size, tok.eot_id, on_step=text)
    if text is not None:
        text.close()
    if out.table_full:
        notice(f"notice: stopped after {max(map(len, out.tokens))} new tokens: pos={loaded.spec.pos} "
               f"places at most model.max_seq_len={loaded.spec.max_seq_len} tokens (prompt and text); "
               "a shorter --prompt leaves more room")
    return Samples(tok.decode(ids), [tok.decode(t) for t in out.tokens], out.tokens, loaded.step, notices)
