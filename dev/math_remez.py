# Minimax fits (weighted Remez, mpmath) for src/core/math.h. Prints float32 hex coefficients.
# Usage: python3 dev/math_remez.py  (about a minute; prints the coefficients used in math.h)
import struct
import mpmath as mp

mp.mp.prec = 120


def f32(x):
    return mp.mpf(struct.unpack('f', struct.pack('f', float(x)))[0])


def remez(f, w, a, b, n, iters=30):
    """p of degree n minimizing max |(p - f) * w| on [a, b]."""
    m = n + 2
    xs = [(a + b) / 2 - (b - a) / 2 * mp.cos(mp.pi * i / (m - 1)) for i in range(m)]
    for _ in range(iters):
        A = [[x**j for j in range(n + 1)] + [(-1)**i / w(x)] for i, x in enumerate(xs)]
        sol = mp.lu_solve(mp.matrix(A), mp.matrix([f(x) for x in xs]))
        c = [sol[j] for j in range(n + 1)]
        E = sol[n + 1]
        err = lambda x: (mp.polyval(c[::-1], x) - f(x)) * w(x)
        # new extrema: dense scan then refine
        N = 4000
        grid = [a + (b - a) * i / N for i in range(N + 1)]
        vals = [err(x) for x in grid]
        ext = []
        i = 0
        # split by sign changes, take max |err| in each run
        runs = []
        cur = [0]
        for i in range(1, N + 1):
            if mp.sign(vals[i]) == mp.sign(vals[cur[0]]) or vals[i] == 0:
                cur.append(i)
            else:
                runs.append(cur)
                cur = [i]
        runs.append(cur)
        ext = [grid[max(r, key=lambda k: abs(vals[k]))] for r in runs]
        if len(ext) > m:  # keep the m with largest errors, contiguous window
            best = None
            for s in range(len(ext) - m + 1):
                mn = min(abs(err(x)) for x in ext[s:s + m])
                if best is None or mn > best[0]:
                    best = (mn, s)
            ext = ext[best[1]:best[1] + m]
        if len(ext) == m:
            xs = ext
    maxerr = max(abs(v) for v in vals)
    return c, E, maxerr


def hexf(x):
    return float(x).hex().replace('0000000p', 'p')


def report(name, c):
    print(name, ', '.join(hexf(f32(v)) for v in c))


ln2 = mp.log(2)
# exp2: 2^r = 1 + r q(r), q ~ (2^r - 1)/r on [-0.5, 0.5]; relative error of 2^r weighted by |r|.
g = lambda r: mp.expm1(r * ln2) / r if r != 0 else ln2
for n in (5,):  # ls_exp2f
    c, E, me = remez(g, lambda r: 1 / mp.power(2, r), mp.mpf(-0.5), mp.mpf(0.5), n)
    print('exp2 q deg', n, 'max err (abs on q / 2^r)', mp.nstr(me, 5), 'log2', mp.nstr(mp.log(me, 2), 5))
    report('  q', c)
# exp core: Q(t) ~ (e^t - 1 - t)/t^2 on [-0.3467, 0.3467]
def Q(t):
    if abs(t) < mp.mpf(2)**-20:
        return mp.mpf(0.5) + t / 6 + t**2 / 24
    with mp.workprec(600):
        return (mp.exp(t) - 1 - t) / t**2
T = mp.log(2) / 2 + mp.mpf(2)**-12
for n in (5,):  # ls_expf
    c, E, me = remez(Q, lambda t: (t**2 + mp.mpf(2)**-40) / mp.exp(t), -T, T, n)
    print('exp Q deg', n, 'log2 err', mp.nstr(mp.log(me, 2), 5))
    report('  Q', c)
# log tails: log2(m) = K s + s^3 T2(z), ln(m) = 2 s + s^3 Te(z), z = s^2 in [0, zmax];
# s = (m-1)/(m+1), m in [sqrt(1/2), sqrt(2)]; relative error of the result ~ z * dT / K.
smax = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)
zmax = smax**2 * (1 + mp.mpf(2)**-10)
def atanh_tail(z):  # (atanh(s)/s - 1)/z
    if z < mp.mpf(2)**-30:
        return mp.mpf(1) / 3 + z / 5
    with mp.workprec(600):
        s = mp.sqrt(z)
        return (mp.atanh(s) / s - 1) / z
for n in (2,):  # ls_log2f, ls_logf
    for name, scale in (('log2 T2', 2 / ln2), ('ln Te', mp.mpf(2))):
        c, E, me = remez(lambda z: scale * atanh_tail(z), lambda z: (z + mp.mpf(2)**-40) / scale,
                         mp.mpf(0), zmax, n)
        print(name, 'deg', n, 'log2 rel err', mp.nstr(mp.log(me, 2), 5))
        report('  ' + name, c)
