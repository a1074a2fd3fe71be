#!/usr/bin/env python3
"""How wide topp_bracket's bracket is on flat rows (docs/perf.md, session 33): level 0's counts of
a row of N(0, scale) logits, each bin's mass bounded as sampling.cuh's bin_mass_bounds does, the
bins that surely precede top-p's boundary and those that surely do not, and how many entries lie
between (the list the one mass pass fills); then top-k's list from the tile maxima. float32 logits,
lse in float64 then rounded (numpy)."""
import numpy as np, math
rng = np.random.default_rng(1)
V = 151936
for tau_scale, name in [(1.33, "tau 1"), (1.33 * 4, "tau 0.25")]:
  for top_p in [0.5, 0.9, 0.95, 0.99]:
    y = (rng.standard_normal(V) * tau_scale).astype(np.float32)
    m = y.max(); lse = np.float32(m + np.log(np.exp((y - m).astype(np.float64)).sum()))
    d = (y - lse).astype(np.float32)
    x = np.maximum(np.float32(32) - d, np.float32(32)).astype(np.float32)
    b = ((x.view(np.uint32).astype(np.int64) - 0x42000000) >> 11)
    b = np.minimum(b, 4095)
    cnt = np.bincount(b, minlength=4096)
    bb = np.arange(4096)
    dhi = -bb / 128 + 2**-19; dlo = -(bb + 1) / 128 - 2**-19
    hi = np.floor(np.minimum(np.exp(dhi) * (1 + 2**-21), 1.0) * 2**32)
    lo = np.where(dlo < -23, 0, np.floor(np.exp(dlo) * (1 - 2**-21) * 2**32))
    hi[4095] = lo[4095] = 0
    clo = np.cumsum(cnt * lo); chi = np.cumsum(cnt * hi); qlo = clo[-1]; qhi = chi[-1]
    thr = lambda Q: np.ceil(top_p * Q)
    before = chi < thr(chi + (qlo - clo)); after = clo >= thr(clo + (qhi - chi))
    b_lo = int(np.argmax(~before)); b_hi = int(np.argmax(after))
    print(name, top_p, "bracket bins", b_lo, b_hi, "entries", int(cnt[b_lo:b_hi + 1].sum()))

# top-k's list from the tile maxima: level 0 of the 594 tile maxima (256-entry tiles), the bin of
# the k-th largest, and how many entries of the row lie in the bins up to it.
for scale, name in [(1.33, "tau 1"), (1.33 * 4, "tau 0.25")]:
    for k in [1, 20, 50, 100, 594]:
        y = (rng.standard_normal(151936) * scale).astype(np.float32)
        m = y.max(); lse = np.float32(m + np.log(np.exp((y - m).astype(np.float64)).sum()))
        def binof(v):
            d = (v - lse).astype(np.float32)
            x = np.maximum(np.float32(32) - d, np.float32(32)).astype(np.float32)
            return np.minimum((x.view(np.uint32).astype(np.int64) - 0x42000000) >> 11, 4095)
        pad = np.full(152064 - 151936, -np.inf, dtype=np.float32)
        tiles = np.concatenate([y, pad]).reshape(-1, 256).max(axis=1)
        b_k = int(np.sort(binof(tiles))[k - 1])
        print(name, "top-k", k, "list entries", int((binof(y) <= b_k).sum()))
