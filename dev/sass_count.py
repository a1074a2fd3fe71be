#!/usr/bin/env python3
"""Instruction counts of a kernel's SASS (the counts quoted in docs/perf.md, session 19).

Usage: dev/sass_count.py OBJECT KERNEL_SUBSTRING [--cuobjdump PATH] [--range LO HI ...] [--list]
  OBJECT: a compiled object, e.g. build-gpu/CMakeFiles/lockstep_cuda.dir/src/cuda/attention.cu.o
  KERNEL_SUBSTRING: part of the mangled name (attn_wg_prefill_kernel, dkdv_wg_kernel, ...)
  --range LO HI: count only the instructions at addresses [LO, HI) (hex); several ranges add up
    (a path through the loop: its blocks between the branch targets, read off --list)
  --list: print every instruction with its address (to find a path's ranges)
Prints the instruction count, the uniform-datapath count (U* opcodes), local-memory accesses
(LDL/STL) and the most frequent opcodes. cuobjdump: the CUDA toolkit's, else Triton's
(pip download triton; it is under triton/backends/nvidia/bin/).
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("obj")
    ap.add_argument("kernel")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--range", nargs=2, action="append", default=[], metavar=("LO", "HI"))
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    sass = subprocess.run([a.cuobjdump, "-sass", a.obj], check=True, capture_output=True,
                          text=True).stdout
    funcs = [f for f in re.split(r"\n\s+Function : ", sass)[1:] if a.kernel in f.split("\n")[0]]
    if len(funcs) != 1:
        names = [f.split("\n")[0] for f in funcs]
        sys.exit(f"{len(funcs)} kernels match '{a.kernel}': {names}")
    ins = []
    for line in funcs[0].split("\n"):
        m = re.match(r"\s+/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    if a.range:
        spans = [(int(lo, 16), int(hi, 16)) for lo, hi in a.range]
        ins = [(x, t) for x, t in ins if any(lo <= x < hi for lo, hi in spans)]
    if a.list:
        for x, t in ins:
            print(f"{x:#07x} {t}")
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                              for _, t in ins)
    uniform = sum(n for op, n in ops.items() if op.startswith("U"))
    print(f"{funcs[0].split(chr(10))[0][:100]}")
    print(f"instructions {len(ins)}  uniform {uniform}  LDL/STL {ops['LDL'] + ops['STL']}")
    print("  ".join(f"{op} {n}" for op, n in ops.most_common(16)))


if __name__ == "__main__":
    main()
