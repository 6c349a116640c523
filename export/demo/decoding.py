"""Minimal PyTorch decoders for the demo's own quality report: plain AR and vanilla SD.

Why here and not in specrt.runtime: the report and the acceptance-length check must run
while the runtime is being built, and training must not depend on it. Both loops follow
docs/contracts.md exactly — one preallocated KV buffer per model, window steps through
GPT.step with an explicit mask, commits of accepted rows only — and take their
distributions from specrt.runtime.sampling, the single home of CFG/temperature/top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.lazy import require
from specrt.runtime.sampling import SamplingParams, sample, target_probabilities

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
    """accepted_length: tokens committed per target verification (accepted drafts + 1), per call."""

    accepted_lengths: list[int]
    drafted: int
    accepted: int

    @property
    def mean_accepted_length(self) -> float:
        return float(np.mean(self.accepted_lengths))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(1, self.drafted)


def speculative_generate(target: GPT, draft: GPT, class_ids: np.ndarray, params: SamplingParams, draft_len: int,
                         seed: int) -> tuple[np.ndarray, SpeculativeStats]:
    """Vanilla speculative decoding (lossless): accept x̃_i if r_i ≤ min(1, P/Q); at the first
    rejection sample Norm([P − Q]_+); if all are accepted take a bonus token from P.

    Rows decode in lock-step windows but accept independently (per-row KV lengths).
    """
    rng = np.random.default_rng(seed)
    n_tokens = target.config.num_image_tokens
    n_seq = len(class_ids)
    capacity = target.config.seq_len + draft_len + 1
    t_cache = KVBuffer(target, 2 * n_seq if params.uses_cfg else n_seq, capacity)
    d_cache = KVBuffer(draft, 2 * n_seq if params.uses_cfg else n_seq, capacity)
    codes = np.zeros((n_seq, n_tokens), dtype=np.int64)
    codes[:, 0] = sample(target_probabilities(t_cache.prefill(_conditions(target, class_ids, params)), params), rng)
    d_cache.prefill(_conditions(draft, class_ids, params))
    produced = np.ones(n_seq, dtype=np.int64)  # tokens known per row; the last one is not yet in either cache
    stats = SpeculativeStats([], 0, 0)
    rows = np.arange(n_seq)
    while (produced < n_tokens).any():
        last = codes[rows, produced - 1]
        # draft: propose draft_len tokens, then feed the last proposal so the cache covers all of them
        drafts, q = np.zeros((n_seq, draft_len), dtype=np.int64), []
        x = last
        for i in range(draft_len + 1):
            logits, present = d_cache.step(_rows(x[:, None], params))
            d_cache.commit(present, np.ones(len(d_cache.length), dtype=np.int64))
            if i == draft_len:
                break
            q.append(target_probabilities(logits[:, 0], params))
            x = drafts[:, i] = sample(q[-1], rng)
        # target: verify [last, x̃_1..x̃_L] in one window
        window = np.concatenate([last[:, None], drafts], axis=1)
        logits, present = t_cache.step(_rows(window, params))
        p = target_probabilities(logits, params)  # [S, L+1, V]
        n_accepted = np.zeros(n_seq, dtype=np.int64)
        for s in range(n_seq):
            if produced[s] >= n_tokens:
                continue
            limit = min(draft_len, n_tokens - produced[s] - 1)  # leave room for the final sampled token
            new = []
            for i in range(limit):
                token = drafts[s, i]
                if rng.random() <= min(1.0, p[s, i, token] / q[i][s, token]):
                    new.append(token)
                    continue
                residual = np.maximum(p[s, i] - q[i][s], 0.0)
                new.append(int(sample(residual[None] / residual.sum(), rng)[0]))
                break
            else:
                new.append(int(sample(p[s, limit][None], rng)[0]))
            codes[s, produced[s]:produced[s] + len(new)] = new
            n_accepted[s] = len(new) - 1
            stats.drafted += limit
            stats.accepted += len(new) - 1
            stats.accepted_lengths.append(len(new))
        active = produced < n_tokens
        commit = np.where(active, n_accepted + 1, 0)  # `last` plus the accepted drafts
        t_cache.commit(present, _rows(commit, params))
        d_cache.length -= _rows(draft_len + 1 - commit, params)  # roll back by moving the length: nothing to erase
        produced += np.where(active, n_accepted + 1, 0)
    return codes, stats
