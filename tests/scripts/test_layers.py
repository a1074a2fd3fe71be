#!/usr/bin/env python3
"""The library's layers depend only downwards (CMakeLists.txt names them):

  core <- contract <- cpu (+ dist) <- engine (+ baseline/cpu);  contract <- cuda, baseline/cuda kernels;
  engine + cuda + baseline/cuda <- engine/cuda

Checked two ways: (1) every #include "..." of a source file names a header of its own layer or of a
layer below it (public headers include only public headers); (2) when a build directory is given
and holds the static libraries, every lockstep symbol liblockstep_cuda.a needs is defined in
liblockstep_cuda.a, liblockstep_gemm_plan.a (its host-only planner), liblockstep_contract.a or
liblockstep_core.a (so the CUDA backend really links contract + core only)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# layer of a source directory -> the include prefixes it may use
ALLOWED = {
    "include/lockstep": ("lockstep/",),
    "src/core": ("lockstep/", "core/"),
    "src/contract": ("lockstep/", "core/", "contract/"),
    "src/cpu": ("lockstep/", "core/", "contract/", "cpu/"),
    # ranks' communicators: bytes only, no numerics (built into lockstep_cpu)
    "src/dist": ("lockstep/", "core/", "dist/"),
    # the NCCL transport (lockstep_dist_nccl, CUDA on): the same, over the CUDA runtime and NCCL
    "src/dist/nccl": ("lockstep/", "core/", "dist/"),
    "src/cuda": ("lockstep/", "core/", "contract/", "cuda/"),
    # the audit compares the invariant backend with the baseline one, and runs rank-local
    # rollouts over the thread transport (dist/, part of lockstep_cpu)
    "src/engine": ("lockstep/", "core/", "contract/", "cpu/", "dist/", "engine/", "baseline/cpu/"),
    "src/engine/cuda": ("lockstep/", "core/", "contract/", "cpu/", "engine/", "cuda/"),
    "src/baseline": ("lockstep/", "core/", "contract/", "engine/"),
    "src/baseline/cpu": ("lockstep/", "core/", "contract/", "engine/", "baseline/"),
    "src/baseline/cuda": ("lockstep/", "core/", "contract/", "engine/", "baseline/"),
    # the Python bindings (lockstep._C): the public ops over DLPack views, and the engine
    # (lockstep.Engine: model loading, rollout, scoring, on the invariant backends)
    "src/python": ("lockstep/", "core/", "python/", "engine/"),
}


def layer_of(path):
    rel = path.relative_to(ROOT).as_posix()
    best = None
    for layer in ALLOWED:
        if rel.startswith(layer + "/") and (best is None or len(layer) > len(best)):
            best = layer
    return best


def check_includes():
    bad = []
    for path in sorted(ROOT.glob("include/**/*")) + sorted(ROOT.glob("src/**/*")):
        if path.suffix not in (".h", ".cc", ".cu", ".cuh") or not path.is_file():
            continue
        layer = layer_of(path)
        if layer is None:
            bad.append(f"{path.relative_to(ROOT)}: in no known layer (add it to ALLOWED)")
            continue
        for inc in INCLUDE.findall(path.read_text()):
            if not inc.startswith(ALLOWED[layer]):
                bad.append(f"{path.relative_to(ROOT)}: includes \"{inc}\" ({layer} may include "
                           f"only {', '.join(ALLOWED[layer])})")
    return bad


def symbols(lib, defined):
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-C", flag, str(lib)], capture_output=True, text=True,
                         check=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split(maxsplit=2 if defined else 1)
        if defined and len(parts) == 3 and parts[1] in "TWVBDR":
            syms.add(parts[2])
        elif not defined and len(parts) == 2 and parts[0] == "U":
            syms.add(parts[1])
    return syms


def check_cuda_links(build):
    cuda = build / "liblockstep_cuda.a"
    if not cuda.exists():
        print(f"[layers] {cuda} not built (CUDA off): link check not run")
        return []
    have = set()
    for name in ("lockstep_cuda", "lockstep_gemm_plan", "lockstep_contract", "lockstep_core"):
        have |= symbols(build / f"lib{name}.a", defined=True)
    need = {s for s in symbols(cuda, defined=False) if s.startswith("lockstep::")}
    missing = sorted(need - have)
    print(f"[layers] liblockstep_cuda.a needs {len(need)} lockstep symbols, "
          f"{len(need) - len(missing)} defined in cuda + gemm plan + contract + core")
    return [f"liblockstep_cuda.a needs {s} from outside contract + core" for s in missing]


def main():
    bad = check_includes()
    if len(sys.argv) > 1:
        bad += check_cuda_links(pathlib.Path(sys.argv[1]))
    for b in bad:
        print("FAIL", b)
    print(f"{0 if bad else 1} passed, {1 if bad else 0} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
