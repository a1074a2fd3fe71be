#!/usr/bin/env python3
"""Host-side look at the SFU exp2 tables that dev/ex2/probe_ex2.cu wrote (g_delta.bin = T+,
gn_delta.bin = T-, int8 steps of the bit patterns from T±[0] = 1.0); the numbers quoted in
contract §P.11 and docs/perf.md (session 26).

Prints, per table: the error against 2^(±F/2^23) in ulps of the result's binade and whether the
table is monotone; how often T-[F] equals T+[2^23 - F] / 2 (the SFU is not symmetric); with --lp
(needs scipy, ~1 minute): whether each of T+'s 64 segments of 2^17 entries is floor(a + b t + c t^2)
for some real a, b, c (t = position in the segment / 2^17 - 1/2), as a max-min LP over the slack; a
negative best slack means no such quadratic exists (the datapath truncates inside).
  python3 dev/ex2/analyze.py DIR [--lp]
"""
import sys

import numpy as np

N = 1 << 23


def load(path):
    d = np.fromfile(path, dtype=np.int8).astype(np.int64)
    assert d.size == N, path
    d[0] = 0
    return 0x3F800000 + np.cumsum(d)


def as_float(bits):
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def error_ulps(bits, sign):
    f = np.arange(N, dtype=np.float64) * 2.0**-23
    ref = np.exp2(sign * f)
    ulp = np.exp2(np.floor(np.log2(ref)) - 23)
    return (as_float(bits) - ref) / ulp


def segment_slack(mant, s, seg_bits=17):
    from scipy.optimize import linprog

    n = 1 << seg_bits
    t = np.arange(n, dtype=np.float64) / n - 0.5  # centred: a better-conditioned LP
    y = mant[s * n:(s + 1) * n] - mant[s * n + n // 2]
    one = np.ones(n)
    # variables a, b, c, d: maximize d subject to y + d <= a + b t + c t^2 <= y + 1 - d
    g = np.vstack([np.column_stack([-one, -t, -t * t, one]), np.column_stack([one, t, t * t, one])])
    h = np.concatenate([-y, y + 1])
    r = linprog([0, 0, 0, -1], A_ub=g, b_ub=h, bounds=[(None, None)] * 3 + [(-5, 1)],
                method="highs")
    return r.x[3] if r.status == 0 else float("nan")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    tp, tn = load(f"{d}/g_delta.bin"), load(f"{d}/gn_delta.bin")
    for name, bits, sign in (("T+", tp, 1.0), ("T-", tn, -1.0)):
        e = error_ulps(bits, sign)
        mono = np.all(np.diff(bits) >= 0) if sign > 0 else np.all(np.diff(bits) <= 0)
        print(f"{name}: error {e.min():.4f} .. {e.max():.4f} ulp, monotone {mono}")
    f = np.arange(1, N)
    half = as_float(tp[N - f]) / 2
    same = np.count_nonzero(as_float(tn[f]) == half)
    print(f"T-[F] == T+[2^23 - F] / 2 for {same} of {N - 1} F ({100 * same / (N - 1):.1f}%)")
    if "--lp" in sys.argv:
        mant = (tp & 0x7FFFFF).astype(np.float64)
        slack = [segment_slack(mant, s) for s in range(64)]
        print(f"T+ per 2^17 segment, best slack of floor(quadratic): {np.nanmin(slack):.4f} .. "
              f"{np.nanmax(slack):.4f} ulp ({sum(np.isnan(slack))} LPs unsolved)")


if __name__ == "__main__":
    main()
