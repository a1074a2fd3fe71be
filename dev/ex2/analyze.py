#!/usr/bin/env python3
"""Host-side look at the SFU exp2 table that dev/ex2/probe_ex2.cu wrote (g_delta.bin, g[0] = 1.0).

g[F] = ex2.approx.ftz.f32(F * 2^-23) for F in [0, 2^23). Prints its error against 2^(F/2^23) in
ulps and looks for the interpolator's segments: within a segment of 2^b entries the mantissa is a
quadratic in the low bits (plus truncation noise), so a least-squares quadratic per segment leaves
residuals of about an ulp for the right b and larger jumps at the boundaries for a wrong one.
  python3 dev/ex2/analyze.py DIR_WITH_g_delta.bin
"""
import sys

import numpy as np


def load(d):
    delta = np.fromfile(f"{d}/g_delta.bin", dtype=np.int8).astype(np.int64)
    bits = 0x3F800000 + np.cumsum(delta)
    return bits


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    bits = load(d)
    n = bits.size
    f = np.arange(n, dtype=np.float64) * 2.0**-23
    mant = (bits & 0x7FFFFF).astype(np.float64)  # all in [1, 2)
    exact = (np.exp2(f) - 1.0) * 2.0**23  # mantissa in ulps, real-valued
    err = mant - exact
    print(f"entries {n}; exponent field all 127: {np.all((bits >> 23) == 127)}")
    print(f"error vs 2^f in ulps: min {err.min():.4f} max {err.max():.4f} mean {err.mean():.4f} "
          f"rms {np.sqrt((err**2).mean()):.4f}")
    print(f"monotone non-decreasing: {np.all(np.diff(bits) >= 0)}")
    for b in range(14, 20):
        seg = 1 << b
        xl = np.arange(seg, dtype=np.float64)
        V = np.vstack([np.ones(seg), xl, xl * xl]).T
        worst = 0.0
        for s in range(n // seg):
            y = mant[s * seg:(s + 1) * seg]
            coef, *_ = np.linalg.lstsq(V, y, rcond=None)
            r = y - V @ coef
            worst = max(worst, np.abs(r).max())
        print(f"segments of 2^{b} ({n // seg}): worst |residual| of a per-segment quadratic "
              f"{worst:.3f} ulp")


if __name__ == "__main__":
    main()
