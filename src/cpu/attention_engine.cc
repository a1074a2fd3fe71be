// The canonical attention arithmetic on the CPU (docs/contract.md §A A.3-A.4): one
// 64-key block step (MMA-model scores, scale, max rule, ls_ex2_sfu, bf16 P, halving-tree row sum,
// MMA-model PV chained from the rescaled accumulator), the chunk merge, the final normalization,
// and the tile runner. Every (row, head) is computed by one task in this fixed order.
#include "cpu/attention_engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/math.h"
#include "core/thread_pool.h"
#include "cpu/mma_batch.h"

namespace lockstep::cpu::attn_detail {
namespace {

constexpr int kB = kAttnBlock;
constexpr float kLn2f = 0x1.62e43p-1f;  // ln 2 rounded to fp32
// NOTE: NaN results are stored as one pattern (as in the elementwise ops) so CPU and GPU agree
// bit for bit: bf16 0x7FC0, fp32 0x7FC00000.
constexpr uint16_t kNanBf16 = 0x7FC0;
constexpr uint32_t kNanF32 = 0x7FC00000u;

bf16 store_bf16(float f) {
  if ((f32_bits(f) & 0x7fffffffu) > 0x7f800000u) return bf16{kNanBf16};
  return f32_to_bf16(f);
}
float store_f32(float f) { return f != f ? f32_from_bits(kNanF32) : f; }

// The contract's max: NaN operands are ignored (b > a is false), a zero result is +0.
inline float max_rule(float a, float b) {
  float m = b > a ? b : a;
  return m == 0.0f ? 0.0f : m;
}

// Row sum of one block: the halving tree over 64 fp32 values (p[i] += p[i + w], w = 32 .. 1).
// It is the register layout of an m16n8 accumulator fragment: three in-thread levels, two quad
// shuffles (xor 2, xor 1), one in-thread level. Destroys p.
inline float halving_tree64(float* p) {
  for (int w = kB / 2; w >= 1; w /= 2) {
    for (int i = 0; i < w; ++i) p[i] = p[i] + p[i + w];
  }
  return p[0];
}

// Copies keys j0 .. j0+nk-1 (nk <= 64) of one kv head: K rows to kblk [64, D], V transposed to
// vt [D, 64] with +0 in the columns nk .. 63. Nothing past j0+nk-1 is read.
void gather_block(const KvSource& s, int64_t kvh, int64_t j0, int nk, int64_t D, bf16* kblk,
                  bf16* vt) {
  for (int j = 0; j < nk; ++j) {
    int64_t ko, vo;
    s.offsets(j0 + j, &ko, &vo);
    std::memcpy(kblk + j * D, s.k + ko + kvh * s.k_sh, size_t(D) * sizeof(bf16));
    const bf16* vr = s.v + vo + kvh * s.v_sh;
    for (int64_t d = 0; d < D; ++d) vt[d * kB + j] = vr[d];
  }
  if (nk < kB) {
    for (int64_t d = 0; d < D; ++d) {
      for (int j = nk; j < kB; ++j) vt[d * kB + j] = bf16{0};
    }
  }
}

// One 64-key block for one (row, head): the row's keys kblk[0 .. nv) (nv >= 1) are valid; the
// others (causally masked or past the tile's last key) are never used: their P is +0 and their V
// is taken as +0. vt holds the block's nk >= nv keys (+0 past nk); vmask [D, 64] is scratch.
// `first` = first block of a chunk (state (-inf, 0, +0): alpha = 0).
void block_step(const bf16* q, const bf16* kblk, const bf16* vt, int nv, int nk, int64_t D,
                float scale, bool first, float* st, bf16* vmask) {
  float x[kB];
  // Scores: one MMA-model chain over D per key, from +0, times the scale.
  block_scores(q, kblk, D, nv, D, scale, x);
  float mb = -INFINITY;
  for (int j = 0; j < nv; ++j) mb = max_rule(mb, x[j]);
  const float m_old = st[0];
  const float m_new = first ? mb : max_rule(m_old, mb);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all scores -inf/NaN: no -inf - -inf
  float p[kB];
  bf16 pb[kB];
  for (int j = 0; j < nv; ++j) {
    p[j] = ls_ex2_sfu(x[j] - m_use);
    pb[j] = f32_to_bf16(p[j]);
  }
  for (int j = nv; j < kB; ++j) {
    p[j] = 0.0f;
    pb[j] = bf16{0};
  }
  const float rowsum = halving_tree64(p);
  const float alpha = first ? 0.0f : ls_ex2_sfu(m_old - m_use);
  st[1] = first ? rowsum : alpha * st[1] + rowsum;
  // P·V: per d, the 4 k-blocks of the 64 keys chained from c = alpha·acc[d] (+0 when first).
  // Keys nv .. nk-1 are in vt but masked for this row: a copy with their V = +0 (0·inf is NaN).
  const bf16* v = vt;
  if (nv < nk) {
    for (int64_t d = 0; d < D; ++d) {
      std::memcpy(vmask + d * kB, vt + d * kB, size_t(nv) * sizeof(bf16));
      std::memset(static_cast<void*>(vmask + d * kB + nv), 0, size_t(kB - nv) * sizeof(bf16));
    }
    v = vmask;
  }
  float* acc = st + 2;
  if (!first) {
    for (int64_t d = 0; d < D; ++d) acc[d] = alpha * acc[d];
  }
  mma_chain_rows_bf16(pb, v, kB, D, kB, first ? nullptr : acc, acc);
  st[0] = m_new;
}

// The canonical chunk merge: run = merge(run, cur).
void merge_state(float* run, const float* cur, int64_t D) {
  const float m_a = run[0], m_b = cur[0];
  const float m = max_rule(m_a, m_b);
  const float m_use = m == -INFINITY ? 0.0f : m;
  const float a = ls_ex2_sfu(m_a - m_use), b = ls_ex2_sfu(m_b - m_use);
  run[1] = a * run[1] + b * cur[1];
  for (int64_t d = 0; d < D; ++d) run[2 + d] = a * run[2 + d] + b * cur[2 + d];
  run[0] = m;
}

// out = acc * (1 / l), rounded once; lse = (m + log2 l) * ln2.
void finalize_state(const float* st, int64_t D, bf16* out, float* lse) {
  const float inv = 1.0f / st[1];
  for (int64_t d = 0; d < D; ++d) out[d] = store_bf16(st[2 + d] * inv);
  if (lse != nullptr) *lse = store_f32((st[0] + ls_log2f(st[1])) * kLn2f);
}

struct Scratch {
  std::vector<bf16> kblk, vt, vmask;
  std::vector<float> cur, run;
  std::vector<int64_t> cend;
  std::vector<uint8_t> has_run;
};

void run_tile(const Ctx& cx, const Tile& t, int64_t kvh, Scratch& sc) {
  const int64_t D = cx.D, G = cx.G, K = cx.K, SS = state_size(D);
  const int64_t nr = t.rend - t.rbeg;
  const int64_t* rows = cx.order + t.rbeg;
  sc.kblk.resize(size_t(kB * D));
  sc.vt.resize(size_t(kB * D));
  sc.vmask.resize(size_t(kB * D));
  sc.cur.resize(size_t(nr * G * SS));
  sc.run.resize(size_t(nr * G * SS));
  sc.cend.resize(size_t(nr));
  sc.has_run.assign(size_t(nr), 0);
  int64_t c_end_tile = t.c_lo;
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = rows[i];
    sc.cend[i] = std::min(t.c_hi, cx.chunks(r));
    c_end_tile = std::max(c_end_tile, sc.cend[i]);
    if (cx.finish == Finish::kFinalize && cx.has_prefix != nullptr && cx.has_prefix[r]) {
      for (int64_t g = 0; g < G; ++g) {
        const float* src = cx.prefix + (r * cx.Hq + kvh * G + g) * SS;
        std::copy(src, src + SS, sc.run.data() + (i * G + g) * SS);
      }
      sc.has_run[i] = 1;
    }
  }
  for (int64_t c = t.c_lo; c < c_end_tile; ++c) {
    int64_t max_pos = -1;  // furthest key any row active in this chunk needs
    for (int64_t i = 0; i < nr; ++i) {
      if (sc.cend[i] > c) max_pos = std::max(max_pos, cx.pos[rows[i]]);
    }
    if (max_pos < 0) continue;
    const int64_t j_begin = c * K, j_end = std::min((c + 1) * K, max_pos + 1);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += kB) {
      const int nk = int(std::min<int64_t>(kB, j_end - j0));
      gather_block(t.src, kvh, j0, nk, D, sc.kblk.data(), sc.vt.data());
      for (int64_t i = 0; i < nr; ++i) {
        const int64_t r = rows[i];
        if (sc.cend[i] <= c || cx.pos[r] < j0) continue;
        const int nv = int(std::min<int64_t>(nk, cx.pos[r] - j0 + 1));
        for (int64_t g = 0; g < G; ++g) {
          block_step(cx.qrow(r, kvh * G + g), sc.kblk.data(), sc.vt.data(), nv, nk, D, cx.scale,
                     j0 == j_begin, sc.cur.data() + (i * G + g) * SS, sc.vmask.data());
        }
      }
    }
    for (int64_t i = 0; i < nr; ++i) {
      if (sc.cend[i] <= c) continue;
      const int64_t r = rows[i];
      for (int64_t g = 0; g < G; ++g) {
        const float* cur = sc.cur.data() + (i * G + g) * SS;
        if (cx.finish == Finish::kStoreChunks) {
          const int64_t h = kvh * G + g;
          // Stored states are op outputs: every NaN is the canonical 0x7FC00000 (contract §4).
          *cx.states.mp(r, h, c) = canonical_f32(cur[0]);
          *cx.states.lp(r, h, c) = canonical_f32(cur[1]);
          std::transform(cur + 2, cur + SS, cx.states.ap(r, h, c),
                         [](float x) { return canonical_f32(x); });
        } else {
          float* run = sc.run.data() + (i * G + g) * SS;
          if (sc.has_run[i]) {
            merge_state(run, cur, D);
          } else {
            std::copy(cur, cur + SS, run);
          }
        }
      }
      sc.has_run[i] = 1;
    }
  }
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = rows[i];
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = kvh * G + g;
      const float* run = sc.run.data() + (i * G + g) * SS;
      switch (cx.finish) {
        case Finish::kFinalize:
          finalize_state(run, D, cx.out + r * cx.o_s0 + h * cx.o_s1,
                         cx.lse ? cx.lse + r * cx.l_s0 + h * cx.l_s1 : nullptr);
          break;
        case Finish::kStorePrefix:
          std::copy(run, run + SS, cx.prefix + (r * cx.Hq + h) * SS);
          break;
        case Finish::kStoreChunks:
          // Chunks of the range past this row's last chunk: the empty state.
          for (int64_t c = std::max(t.c_lo, sc.cend[i]); c < t.c_hi; ++c) {
            *cx.states.mp(r, h, c) = -INFINITY;
            *cx.states.lp(r, h, c) = 0.0f;
            std::fill(cx.states.ap(r, h, c), cx.states.ap(r, h, c) + D, 0.0f);
          }
          break;
      }
    }
  }
}

}  // namespace

StridedStates strided(const AttentionChunkStates& s, int64_t c0) {
  StridedStates r;
  r.m = s.m.ptr<float>();
  r.l = s.l.ptr<float>();
  r.acc = s.acc.ptr<float>();
  for (int i = 0; i < 3; ++i) {
    r.ms[i] = s.m.stride[i];
    r.ls[i] = s.l.stride[i];
    r.as[i] = s.acc.stride[i];
  }
  r.c0 = c0;
  return r;
}

void run_tiles(const Ctx& cx, std::vector<Tile>& tiles) {
  const int64_t ntasks = int64_t(tiles.size()) * cx.Hkv;
  if (ntasks == 0) return;
  std::vector<int64_t> order(static_cast<size_t>(ntasks));
  for (int64_t i = 0; i < ntasks; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return tiles[size_t(a / cx.Hkv)].cost > tiles[size_t(b / cx.Hkv)].cost;
  });
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(num_threads(), ntasks);
  parallel_for(workers, 1, [&](int64_t, int64_t) {
    Scratch sc;
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= ntasks) break;
      const int64_t task = order[size_t(i)];
      run_tile(cx, tiles[size_t(task / cx.Hkv)], task % cx.Hkv, sc);
    }
  });
}

int64_t tile_cost(const Ctx& cx, const Tile& t) {
  int64_t blocks = 0;
  for (int64_t i = t.rbeg; i < t.rend; ++i) {
    const int64_t p = cx.pos[cx.order[i]];
    const int64_t lo = t.c_lo * cx.K;
    const int64_t hi = t.c_hi >= (p / cx.K + 1) ? p + 1 : t.c_hi * cx.K;
    if (hi > lo) blocks += (hi - lo + kB - 1) / kB;
  }
  return blocks * cx.G + 1;
}

void merge_states_rows(const Ctx& cx, const StridedStates& st, int64_t N) {
  const int64_t D = cx.D, SS = state_size(D);
  parallel_for(N * cx.Hq, std::max<int64_t>(1, 4096 / SS), [&](int64_t begin, int64_t end) {
    std::vector<float> run(static_cast<size_t>(SS)), cur(static_cast<size_t>(SS));
    for (int64_t rh = begin; rh < end; ++rh) {
      const int64_t r = rh / cx.Hq, h = rh % cx.Hq;
      const int64_t C = cx.chunks(r);
      for (int64_t c = 0; c < C; ++c) {
        float* dst = c == 0 ? run.data() : cur.data();
        dst[0] = *st.mp(r, h, c);
        dst[1] = *st.lp(r, h, c);
        const float* a = st.ap(r, h, c);
        std::copy(a, a + D, dst + 2);
        if (c > 0) merge_state(run.data(), cur.data(), D);
      }
      finalize_state(run.data(), D, cx.out + r * cx.o_s0 + h * cx.o_s1,
                     cx.lse ? cx.lse + r * cx.l_s0 + h * cx.l_s1 : nullptr);
    }
  });
}

}  // namespace lockstep::cpu::attn_detail
