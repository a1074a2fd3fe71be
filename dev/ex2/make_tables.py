#!/usr/bin/env python3
"""Packs the SFU exp2 tables that dev/ex2/probe_ex2.cu read off the GPU into
src/core/ex2_sfu_tables.tar.xz (contract §P.11).

Input: g_delta.bin and gn_delta.bin, 2^23 int8 each: the differences of consecutive bit patterns
of T+[F] = ex2.approx.ftz.f32(F * 2^-23) and T-[F] = ex2.approx.ftz.f32(-F * 2^-23), T±[0] = 1.0.
Output (one member, ex2_sfu_tables.bin, 4 MiB, little-endian uint64): for T+ then T-, two bit
planes of the steps |bits(T[F]) - bits(T[F - 1])| (each 0..3; entry 0's step is 0): plane 0 holds
bit 0 of the steps, plane 1 bit 1; word w of a plane holds the steps of F = 64w .. 64w + 63, F's
at bit F mod 64. Prints the SHA-256 of the member (CMakeLists.txt checks it).
  python3 dev/ex2/make_tables.py OUTDIR OUTDIR src/core/ex2_sfu_tables.tar.xz   (the probe's OUTDIR)
"""
import hashlib
import io
import sys
import tarfile

import numpy as np

N = 1 << 23


def planes(path, sign):
    d = np.fromfile(path, dtype=np.int8).astype(np.int64)
    assert d.size == N, path
    d[0] = 0
    steps = sign * d
    assert steps.min() >= 0 and steps.max() <= 3, (path, steps.min(), steps.max())
    bits = 0x3F800000 + sign * np.cumsum(steps)
    out = []
    for k in range(2):
        p = ((steps >> k) & 1).astype(np.uint8).reshape(-1, 64)
        words = np.packbits(p[:, ::-1], axis=1).view(">u8").ravel().astype("<u8")
        out.append(words)
    return out, bits


def main():
    pos_dir, neg_dir, dst = sys.argv[1:4]
    (p0, p1), bp = planes(f"{pos_dir}/g_delta.bin", +1)
    (n0, n1), bn = planes(f"{neg_dir}/gn_delta.bin", -1)
    # Spot values read off the GPU (ex2_summary.txt / ex2n_summary.txt).
    assert bp[1] == 0x3F800001 and bp[1 << 22] == 0x3FB504F3 and bp[N - 1] == 0x3FFFFFFF
    assert bn[1] == 0x3F7FFFFE and bn[1 << 22] == 0x3F3504F2 and bn[N - 1] == 0x3F000000
    blob = b"".join(a.tobytes() for a in (p0, p1, n0, n1))
    info = tarfile.TarInfo("ex2_sfu_tables.bin")
    info.size = len(blob)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tf:
        tf.addfile(info, io.BytesIO(blob))
    open(dst, "wb").write(buf.getvalue())
    print(f"{dst}: {len(buf.getvalue())} bytes; member sha256 {hashlib.sha256(blob).hexdigest()}")


if __name__ == "__main__":
    main()
