# Model check of the ping-pong GEMM kernel's ring protocol (src/cuda/gemm/mainloop_sm90.cuh, PP = true):
# one producer filling NS mbarrier stages with every job's k-tiles in job order, two consumer
# warpgroups taking the CTA's jobs in turn, stepping their ring position over the other's jobs and
# ordered by named barriers. Random interleavings; mbarrier parity waits modelled exactly
# (try_wait.parity P succeeds when the completed-phase count's parity differs from P). Asserts that
# every consumer wait lands on the fill it expects (ring index r: stage r % NS, fill r / NS + 1) and
# that nothing deadlocks. With --no-order (the named barriers left out) it must fail: that is why
# the kernel has them. Usage: python3 dev/pingpong_ring_sim.py [--no-order]
import random
import sys

ORDER = "--no-order" not in sys.argv
def run(NS, nkt, njobs_cta, seed):
    rnd = random.Random(seed)
    full = [0]*NS      # completed phases
    empty = [0]*NS     # completed phases (one phase = 4 warp arrivals; modelled as one event)
    total = nkt*njobs_cta
    # producer state
    P = dict(r=0, stage=0, phase=0)
    # consumer states: a generator per WG
    def consumer(cw):
        stage, phase = 0, 0
        for local in range(njobs_cta):
            if local % 2 != cw:
                s2 = stage + nkt % NS
                phase ^= (nkt // NS) & 1
                stage = s2 - NS if s2 >= NS else s2
                if s2 >= NS: phase ^= 1
                continue
            if ORDER and local > 0:
                while not bar[cw]: yield 'bar'
                bar[cw] -= 1
            r0 = local*nkt
            for kt in range(nkt):
                # wait full[stage] parity phase: true when (full & 1) != phase
                while (full[stage] & 1) == phase: yield 'full'
                r = r0 + kt
                assert stage == r % NS, (stage, r)
                assert full[stage] == r // NS + 1, ('wrong phase', cw, local, kt, full[stage], r)
                yield 'mma'
                # release (the kernel releases the previous one after the next issue; order kept)
                empty[stage] += 1
                stage += 1
                if stage == NS: stage, phase = 0, phase ^ 1
            if ORDER and local + 1 < njobs_cta: bar[cw ^ 1] += 1
            yield 'epi'
    bar = [0, 0]
    gens = [consumer(0), consumer(1)]
    done = [False, False]
    steps = 0
    while not (all(done) and P['r'] == total):
        steps += 1
        if steps > 10**6: raise SystemExit('deadlock/livelock NS=%d nkt=%d jobs=%d' % (NS, nkt, njobs_cta))
        who = rnd.randrange(3)
        if who == 2:
            if P['r'] < total:
                s = P['stage']
                # producer waits empty parity phase^1: true when (empty & 1) != (phase ^ 1)
                if (empty[s] & 1) != (P['phase'] ^ 1):
                    full[s] += 1
                    P['r'] += 1
                    P['stage'] += 1
                    if P['stage'] == NS: P['stage'], P['phase'] = 0, P['phase'] ^ 1
        elif not done[who]:
            try: next(gens[who])
            except StopIteration: done[who] = True
    return steps
n = 0
for NS in (2, 3, 5):
    for nkt in (1, 2, 3, 4, 5, 6, 7, 11, 16):
        for jobs in range(0, 8):
            for seed in range(20):
                run(NS, nkt, jobs, seed); n += 1
print('ok', n, 'random schedules')
