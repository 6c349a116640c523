"""Minimal PyTorch decoders for the demo's own quality report: plain AR and vanilla SD.

Why here and not in specrt.runtime: the report and the acceptance-length check must run
while the runtime is being built, and training must not depend on it. Both loops follow
docs/contracts.md exactly — one preallocated KV buffer per model, window steps through
GPT.step with an explicit mask, commits of accepted rows only — and take their
distributions from specrt.runtime.sampling (CFG/temperature/top-k) and their acceptance test
from specrt.runtime.verification, so no formula is written twice.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.lazy import require
from specrt.runtime.sampling import SamplingParams, sample, target_probabilities
from specrt.runtime.verification import VanillaRule, verify_chain

torch = require("torch", "demo decoding")

from specrt.export.llamagen_gpt import GPT  # noqa: E402


class KVBuffer:
    """kv [n_layer, 2, batch, n_kv_head, capacity, head_dim] plus a committed length per row."""

    def __init__(self, model: GPT, batch: int, capacity: int):
        cfg = model.config
        self.model = model
        self.capacity = capacity
        self.kv = torch.zeros(cfg.n_layer, 2, batch, cfg.n_kv_head, capacity, cfg.head_dim)
        self.length = np.zeros(batch, dtype=np.int64)

    @torch.no_grad()
    def prefill(self, cond: "torch.Tensor") -> np.ndarray:
        """Run the condition tokens, commit them; returns the logits of image token 0 [B, V]."""
        logits, _, present = self.model.prefill(cond)
        n = present.shape[4]
        self.kv[:, :, :, :, :n] = present
        self.length[:] = n
        return logits[:, -1].numpy()

    @torch.no_grad()
    def step(self, input_ids: np.ndarray) -> tuple[np.ndarray, "torch.Tensor"]:
        """Feed a causal window [B, W] after each row's committed prefix -> (logits [B,W,V], present_kv)."""
        batch, width = input_ids.shape
        # slots past the last image token (finished rows, surplus drafts) are never committed;
        # clamping keeps their RoPE gather inside the table
        positions = np.minimum(self.length[:, None] + np.arange(width)[None], self.model.config.seq_len - 1)
        mask = np.zeros((batch, width, self.capacity + width), dtype=bool)
        mask[:, :, :self.capacity] = np.arange(self.capacity)[None, None] < self.length[:, None, None]
        mask[:, :, self.capacity:] = np.tril(np.ones((width, width), dtype=bool))
        logits, _, present = self.model.step(torch.from_numpy(input_ids), torch.from_numpy(positions),
                                             torch.from_numpy(mask), self.kv)
        return logits.numpy(), present

    def commit(self, present: "torch.Tensor", counts: np.ndarray) -> None:
        """Write the first counts[b] window rows of row b at its length (rejected rows never land)."""
        counts = np.asarray(counts, dtype=np.int64)
        for j in range(int(counts.max(initial=0))):
            rows = np.nonzero(counts > j)[0]
            slots = torch.from_numpy(self.length[rows] + j)
            rows_t = torch.from_numpy(rows)
            # kv[:, :, rows, :, slots] indexes as [R, L, 2, Hkv, D]: move the row dim of the value first
            self.kv[:, :, rows_t, :, slots] = present[:, :, rows_t, :, j].permute(2, 0, 1, 3, 4)
        self.length += counts


def _conditions(model: GPT, class_ids: np.ndarray, params: SamplingParams) -> "torch.Tensor":
    """Class ids [S] -> the model batch: [cond; uncond] when CFG is on."""
    cond = torch.as_tensor(class_ids, dtype=torch.long)
    return torch.cat([cond, model.null_condition(len(cond))]) if params.uses_cfg else cond


def _rows(tokens: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The same tokens for the cond and uncond halves."""
    return np.concatenate([tokens, tokens]) if params.uses_cfg else tokens


def ar_generate(model: GPT, class_ids: np.ndarray, params: SamplingParams, seed: int) -> np.ndarray:
    """Plain autoregressive sampling: one target forward per token. Returns codes int64 [S, grid²]."""
    rng = np.random.default_rng(seed)
    n_tokens = model.config.num_image_tokens
    cond = _conditions(model, class_ids, params)
    cache = KVBuffer(model, len(cond), model.config.seq_len)
    probs = target_probabilities(cache.prefill(cond), params)
    codes = np.zeros((len(class_ids), n_tokens), dtype=np.int64)
    codes[:, 0] = sample(probs, rng)
    for k in range(1, n_tokens):
        logits, present = cache.step(_rows(codes[:, k - 1:k], params))
        cache.commit(present, np.ones(len(cond), dtype=np.int64))
        codes[:, k] = sample(target_probabilities(logits[:, 0], params), rng)
    return codes


@dataclass
class SpeculativeStats:
    """Counts of one speculative run, with the runtime's definition of accepted length."""

    tokens: int = 0
    target_forwards: int = 0  # prefill included, as specrt.runtime.stats counts them
    drafted: int = 0
    accepted: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target forward (1 for AR; at most draft_len + 1)."""
        return self.tokens / max(1, self.target_forwards)

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens the target kept."""
        return self.accepted / max(1, self.drafted)


def speculative_generate(target: GPT, draft: GPT, class_ids: np.ndarray, params: SamplingParams, draft_len: int,
                         seed: int) -> tuple[np.ndarray, SpeculativeStats]:
    """Vanilla speculative decoding (lossless), verified by specrt.runtime.verification's
    verify_chain: accept x̃_i if r_i ≤ min(1, P/Q); at the first rejection sample
    Norm([P − Q]_+); if all are accepted take a bonus token from P.

    Rows decode in lock-step windows but accept independently (per-row KV lengths).
    """
    rng = np.random.default_rng(seed)
    rule = VanillaRule()
    n_tokens = target.config.num_image_tokens
    n_seq = len(class_ids)
    rows = np.arange(n_seq)
    capacity = target.config.seq_len + draft_len + 1
    t_cache = KVBuffer(target, len(_rows(rows, params)), capacity)
    d_cache = KVBuffer(draft, len(_rows(rows, params)), capacity)
    codes = np.zeros((n_seq, n_tokens), dtype=np.int64)
    codes[:, 0] = sample(target_probabilities(t_cache.prefill(_conditions(target, class_ids, params)), params), rng)
    d_cache.prefill(_conditions(draft, class_ids, params))
    stats = SpeculativeStats(tokens=n_seq, target_forwards=n_seq)
    produced = np.ones(n_seq, dtype=np.int64)  # tokens known per row; the last one is not yet in either cache
    while (produced < n_tokens).any():
        last = codes[rows, produced - 1]
        # draft: propose draft_len tokens, then feed the last proposal so its cache covers all of them
        drafts, q = np.zeros((n_seq, draft_len), dtype=np.int64), []
        x = last
        for i in range(draft_len + 1):
            logits, present = d_cache.step(_rows(x[:, None], params))
            d_cache.commit(present, np.ones(len(d_cache.length), dtype=np.int64))
            if i < draft_len:
                q.append(target_probabilities(logits[:, 0], params))
                x = drafts[:, i] = sample(q[-1], rng)
        q_rows = np.stack(q, axis=1)  # [S, L, V]
        # target: verify [last, x̃_1..x̃_L] in one window; row i of p predicts x̃_(i+1)
        logits, present = t_cache.step(_rows(np.concatenate([last[:, None], drafts], axis=1), params))
        p_rows = target_probabilities(logits, params)  # [S, L+1, V]
        n_new = np.zeros(n_seq, dtype=np.int64)
        for s in np.nonzero(produced < n_tokens)[0]:
            limit = min(draft_len, n_tokens - produced[s] - 1)  # leave room for the token sampled after them
            outcome = verify_chain(p_rows[s, :limit + 1], q_rows[s, :limit], drafts[s, :limit], rule, rng)
            new = [*drafts[s, :outcome.accepted_length], outcome.next_token]
            codes[s, produced[s]:produced[s] + len(new)] = new
            n_new[s] = len(new)
            stats.drafted += limit
            stats.accepted += outcome.accepted_length
            stats.tokens += len(new)
            stats.target_forwards += 1
        # commit `last` plus the accepted drafts; the draft rolls back by moving its length
        t_cache.commit(present, _rows(n_new, params))
        d_cache.length -= _rows(draft_len + 1 - n_new, params)
        produced += n_new
    return codes, stats
