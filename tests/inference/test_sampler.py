"""The engine's sampler (``transformers_engine._sample``, ``_inverse_cdf``): exact draws from the
distribution whose log-probs it reports."""

import torch

from ludic.inference.sampling import generator as _generator, inverse_cdf as _inverse_cdf, sample as _sample


def _draw(logits, n, temp=1.0, top_p=1.0, top_k=0, seed0=0):
    B = logits.shape[0]
    rows = logits.expand(n, -1).contiguous() if B == 1 else logits
    t = torch.full((rows.shape[0],), temp)
    return _sample(rows, t, torch.full_like(t, top_p), torch.full((rows.shape[0],), top_k, dtype=torch.long),
                   [_generator(seed0 + i) for i in range(rows.shape[0])])


def test_inverse_cdf_frequencies_match_the_distribution_and_skip_zero_mass():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 300, generator=g) * 2
    logits[0, 100:140] = float("-inf")  # no mass: never drawn
    p = torch.softmax(logits, -1)[0].double()
    n = 60_000
    u = torch.rand(n, generator=g, dtype=torch.float64)
    for block in (64, 256, 299):  # 999: the vocabulary is padded to whole blocks
        idx, total = _inverse_cdf(p.float().expand(n, -1).contiguous(), u, block=block)
        assert torch.allclose(total, p.sum().expand(n), rtol=1e-6)
        freq = torch.bincount(idx, minlength=300).double() / n
        assert freq[100:140].sum() == 0 and idx.max() < 300
        sd = (p * (1 - p) / n).sqrt()
        assert ((freq - p).abs() <= 5 * sd + 1e-6).all()  # every token within 5 standard deviations
    # the edges: u = 0 takes the first token with mass, u -> 1 the last one
    q = torch.tensor([[0.0, 0.0, 0.5, 0.5, 0.0]])
    assert _inverse_cdf(q, torch.tensor([0.0], dtype=torch.float64), block=2)[0].item() == 2
    assert _inverse_cdf(q, torch.tensor([1 - 1e-16], dtype=torch.float64), block=2)[0].item() == 3


def test_sample_reports_the_log_probs_of_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    n = 40_000
    tok, logp = _draw(logits, n, temp=0.5)
    want = torch.log_softmax(logits[0] / 0.5, -1)
    assert torch.allclose(logp, want[tok])
    freq = torch.bincount(tok, minlength=4).double() / n
    assert (freq - want.exp().double()).abs().max() < 0.01


def test_top_k_and_top_p_truncate_before_the_draw():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    tok, logp = _draw(logits, 5000, top_k=2)
    assert set(tok.tolist()) == {0, 1}
    assert torch.allclose(logp.exp()[tok == 0][0], torch.softmax(logits[0, :2], -1)[0])
    p = torch.softmax(logits[0], -1)  # 0.636, 0.234, ...: top_p 0.8 keeps the first two
    tok, _ = _draw(logits, 5000, top_p=0.8)
    assert set(tok.tolist()) == {0, 1} and p[0] < 0.8 < p[0] + p[1]


def test_greedy_rows_and_seeded_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=g)
    temps = torch.tensor([0.0, 1.0, 0.7, 1.0])
    ones, zeros = torch.ones(4), torch.zeros(4, dtype=torch.long)
    tok, logp = _sample(logits, temps, ones, zeros, [_generator(s) for s in (5, 6, 7, 8)])
    assert tok[0] == logits[0].argmax() and torch.isclose(logp[0], torch.log_softmax(logits[0], -1).max())
    for i in (1, 2, 3):  # row i alone, with its own seed: the same token
        alone, _ = _sample(logits[i:i + 1], temps[i:i + 1], ones[:1], zeros[:1], [_generator(5 + i)])
        assert alone.item() == tok[i].item()
