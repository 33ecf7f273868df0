// Sequential reset-aware scans of the linear-recurrent cells (minGRU, the LRU) on the CPU:
// one pass over time forward and one backward, the gates, the restart select and the
// recurrence fused, the inner loop over the N * H features of a step left to the
// compiler's vectoriser. The LRU's input projection stays outside, in torch; minGRU's runs
// inside its fused ops (linear_mingru_fused_*: per step, on register-blocked small matmuls).
//
// Layout: time-major, every [T, N, ...] tensor read with a row stride (the features of a
// row contiguous; incoming gradients with any strides along t and n); reset [T, N] bool, True where the step restarts from the stored state of
// that step (t = 0 always does). A restart *selects* the stored state (a pointer choice per
// row), it never multiplies the carried one by zero: a NaN or Inf in a trajectory does not
// reach the next one, in values or in gradients.
//
// Ops (namespace recurrl):
//   linear_mingru_forward(xp [T,N,2H], bias [2H]?, stored [T,N,H], reset [T,N]) -> h [T,N,H]
//       k | h~ = xp + bias (xp: the input projection without its bias),
//       z = sigmoid(k), a = sigmoid(-k), h_t = a_t * p_t + z_t * h~_t,
//       p_t = reset_t ? stored_t : h_{t-1}
//   linear_mingru_backward(grad_h, xp, bias?, h, stored, reset, stored_grad)
//       -> (d_xp [T,N,2H], d_stored [T,N,H] (empty [0,N,H] when not stored_grad),
//           d_bias [2H] (the sum of d_xp over steps and rows))
//   linear_mingru_fused_forward(x [T,N,F], weight [2H,F], bias [2H]?, stored [T,N,H], reset)
//       -> h [T,N,H]: the same with xp = x weight^T computed in the loop (x and stored with
//       any strides along t and n; h in x's memory order: batch-major for a transposed
//       batch-first input)
//   linear_mingru_fused_backward(grad_h, x, weight, bias?, h, stored, reset, x_grad,
//       weight_grad, stored_grad) -> (d_x [T,N,F] (x's memory order), d_weight [2H,F],
//       d_bias [2H], d_stored [T,N,H]; the first, second and last empty [0,...] when not
//       asked for)
//   linear_lru_forward(bx [T,N,>=2H], stored [T,N,2H], reset, lam_re [H], lam_im [H],
//       gamma [H]) -> h [T,N,2H] as [Re h | Im h]
//       h_t = lambda * p_t + gamma * (bx_re + i bx_im)   (bx's first 2H columns)
//   linear_lru_backward(grad_h, bx, h, stored, reset, lam_re, lam_im, gamma, stored_grad,
//       grad_rest [T,N,E]?)
//       -> (d_bx [T,N,2H+E] (grad_rest copied into the last E columns: the gradient of the
//           columns of bx past 2H, the LRU's D x, in the same pass), d_stored [T,N,2H] or
//           empty, d_lam_re [H], d_lam_im [H], d_gamma [H])

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

// The loops below select (restarts, the sign of the gate's argument) and clamp with
// comparisons; under the default -ftrapping-math GCC keeps those as branches and does not
// vectorise the loops. Nothing here reads the floating-point exception flags. (Functions
// defined before this line, the standard library's among them, are not inlined into the
// loops below: they call none.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

// The loops are compiled for the baseline instruction set (SSE2 on x86-64, what torch's
// extension flags give) and, on x86-64 Linux with GCC, also for AVX2 and AVX-512, the
// widest the CPU has picked once at load time (function multiversioning).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define RECURRL_VECTOR_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define RECURRL_VECTOR_CLONES
#endif
// the helpers of the loops go into each copy of them (an ISA copy calls no baseline one)
#if defined(__GNUC__)
#define RECURRL_INLINE inline __attribute__((always_inline))
#else
#define RECURRL_INLINE inline
#endif

namespace {

// [T, N, C] with contiguous features and rows that follow each other at a fixed stride
// (a slice of the last dimension of a contiguous tensor qualifies): returns the tensor, or a
// contiguous copy, and its row stride.
std::pair<at::Tensor, int64_t> rows_of(const at::Tensor& t, const char* name, int64_t steps,
                                       int64_t n, int64_t min_cols, bool exact = false) {
  TORCH_CHECK(t.dim() == 3 && t.size(0) == steps && t.size(1) == n &&
                  (exact ? t.size(2) == min_cols : t.size(2) >= min_cols),
              "recurrl linear scan: expected ", name, " of shape [", steps, ", ", n, ", ",
              exact ? "" : ">=", min_cols, "], received ", t.sizes());
  const int64_t rs = n > 1 ? t.stride(1) : (steps > 1 ? t.stride(0) : t.size(2));
  const bool rows_ok = t.stride(2) == 1 && rs >= min_cols && (steps == 1 || t.stride(0) == n * rs);
  if (rows_ok) return {t, rs};
  at::Tensor c = t.contiguous();
  return {c, c.size(2)};
}

// A [T, N, C] tensor read row by row (an incoming gradient, an input, a stored state): the
// tensor to read and its strides along t and n. Any layout with contiguous features is read
// in place (a transposed [N, T, C] one among them), one broadcast along t and n (the
// gradient of a sum) as a single row with strides 0; anything else is copied.
std::tuple<at::Tensor, int64_t, int64_t> grad_rows(const at::Tensor& g) {
  if (g.size(2) <= 1 || g.stride(2) == 1) return {g, g.stride(0), g.stride(1)};
  if (g.stride(0) == 0 && g.stride(1) == 0) return {g.select(0, 0).select(0, 0).contiguous(), 0, 0};
  at::Tensor c = g.contiguous();
  return {c, c.stride(0), c.stride(1)};
}

void check_common(const at::Tensor& x, const at::Tensor& reset, const char* op) {
  TORCH_CHECK(x.device().is_cpu(), op, ": expected CPU tensors, received ", x.device(),
              "; run the layer with another backend on this device.");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": expected float32 or float64, received ", x.scalar_type(), ".");
  TORCH_CHECK(x.dim() == 3, op, ": expected a [T, N, C] input, received ", x.sizes());
  TORCH_CHECK(reset.scalar_type() == at::kBool && reset.dim() == 2 &&
                  reset.size(0) == x.size(0) && reset.size(1) == x.size(1),
              op, ": expected reset as a [", x.size(0), ", ", x.size(1),
              "] bool tensor, received ", reset.scalar_type(), " ", reset.sizes());
}

void check_same(const at::Tensor& t, const at::Tensor& like, const char* name, const char* op) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == like.scalar_type(), op,
              ": expected ", name, " as a CPU ", like.scalar_type(), " tensor, received ",
              t.scalar_type(), " on ", t.device(), ".");
}

// exp(x) for x <= 0, written so that the compiler vectorises it (std::exp is a call per
// element without -ffast-math): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor
// polynomial to within an ulp or two (degree 7 in float, 13 in double), 2^n put into the
// exponent bits. Below the smallest normal result it returns about that (~1e-38 / 1e-308)
// instead of a denormal or zero.
template <typename s_t>
struct ExpBits;
template <>
struct ExpBits<float> {
  using int_t = int32_t;
  static constexpr int degree = 7;
  static constexpr float lowest = -87.0f;
  static constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  static constexpr int mantissa = 23, bias = 127;
  static constexpr float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f;
};
template <>
struct ExpBits<double> {
  using int_t = int64_t;
  static constexpr int degree = 13;
  static constexpr double lowest = -708.0;
  static constexpr double magic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr int mantissa = 52, bias = 1023;
  static constexpr double ln2_hi = 0.693147180369123816490, ln2_lo = 1.90821492927058770002e-10;
};

template <typename s_t>
constexpr s_t inverse(int i) {
  return s_t(1) / s_t(i);
}

template <typename s_t>
RECURRL_INLINE s_t exp_nonpositive(s_t x) {
  using B = ExpBits<s_t>;
  using int_t = typename B::int_t;
  x = x < B::lowest ? B::lowest : x;
  const s_t shifted = x * s_t(1.4426950408889634074) + B::magic;
  const s_t n = shifted - B::magic;  // round(x / ln2)
  int_t n_bits, magic_bits;
  __builtin_memcpy(&n_bits, &shifted, sizeof(s_t));
  const s_t magic = B::magic;
  __builtin_memcpy(&magic_bits, &magic, sizeof(s_t));
  const s_t r = (x - n * B::ln2_hi) - n * B::ln2_lo;
  // Horner on sum_i r^i / i!, the coefficients folded at compile time (a division per
  // term would be kept: it is not exact)
  s_t poly = s_t(1);
  for (int i = B::degree; i >= 1; --i) poly = s_t(1) + poly * r * inverse<s_t>(i);
  const int_t scale_bits = (n_bits - magic_bits + B::bias) << B::mantissa;
  s_t scale;
  __builtin_memcpy(&scale, &scale_bits, sizeof(s_t));
  return poly * scale;
}

// z = sigmoid(k) and a = sigmoid(-k) = 1 - z from one exp(-|k|), both without cancellation
// and without overflow; the selects compile to blends.
template <typename s_t>
RECURRL_INLINE void gates(s_t k, s_t& z, s_t& a) {
  const s_t e = exp_nonpositive(k >= s_t(0) ? -k : k);  // exp(-|k|)
  const s_t s = s_t(1) / (s_t(1) + e);
  const s_t q = e * s;
  const bool pos = k >= s_t(0);
  z = pos ? s : q;
  a = pos ? q : s;
}

// ------------------------------------------------------------------------ small matmuls
// The fused minGRU ops below project inside their loops, a step's N rows at a time (the
// matmuls' operands stay in L1/L2): C[m, 0:G] (+)= sum_k A(m, k) B[k, 0:G], with A read at
// A[m * sm + k * sk] (any strides: rows of x, or x transposed for the weight's gradient),
// B row-major [K, G] and G a multiple of the widest vector (the operands padded to it).
// Register blocks of 4 rows by 1-2 vectors, each an accumulator updated once per k; written
// with GCC's vector types at the width of the instruction set picked at run time (AVX-512,
// AVX2+FMA or the baseline's 16 bytes), since a generic 64-byte vector compiled for AVX2
// spills. Against MKL's sgemm at K = 16 (11-17 GFLOP/s on this CPU) about twice as fast.
constexpr int kWidestVector = 64;  // bytes: the operands are padded to a multiple of it

template <typename s_t>
constexpr int64_t padded(int64_t size) {
  constexpr int64_t unit = kWidestVector / sizeof(s_t);
  return (size + unit - 1) / unit * unit;
}

// GCC's vector of VB bytes of s_t (the attribute applies to a typedef of a dependent type,
// not to an alias declaration)
template <typename s_t, int VB>
struct VectorOf {
  typedef s_t type __attribute__((vector_size(VB)));
};

template <typename s_t, int VB, int RB, int CB, bool acc>
RECURRL_INLINE void gemm_block(int64_t m0, const s_t* __restrict__ a, int64_t sm, int64_t sk,
                               int64_t kk, const s_t* __restrict__ b, int64_t ldb,
                               s_t* __restrict__ c, int64_t ldc, int64_t g_cols) {
  using vec = typename VectorOf<s_t, VB>::type;
  constexpr int64_t width = VB / sizeof(s_t);
  for (int64_t g = 0; g < g_cols; g += width * CB) {
    vec sum[RB][CB];
    for (int i = 0; i < RB; ++i) {
      for (int q = 0; q < CB; ++q) {
        if constexpr (acc) {
          __builtin_memcpy(&sum[i][q], c + (m0 + i) * ldc + g + q * width, VB);
        } else {
          sum[i][q] = vec{};
        }
      }
    }
    for (int64_t k = 0; k < kk; ++k) {
      vec bk[CB];
      for (int q = 0; q < CB; ++q) __builtin_memcpy(&bk[q], b + k * ldb + g + q * width, VB);
      for (int i = 0; i < RB; ++i) {
        const vec ak = a[(m0 + i) * sm + k * sk] - vec{};  // broadcast
        for (int q = 0; q < CB; ++q) sum[i][q] += ak * bk[q];
      }
    }
    for (int i = 0; i < RB; ++i) {
      for (int q = 0; q < CB; ++q) {
        __builtin_memcpy(c + (m0 + i) * ldc + g + q * width, &sum[i][q], VB);
      }
    }
  }
}

template <typename s_t, int VB, bool acc>
RECURRL_INLINE void gemm_rows(int64_t m, const s_t* a, int64_t sm, int64_t sk, int64_t kk,
                              const s_t* b, int64_t ldb, s_t* c, int64_t ldc, int64_t g_cols) {
  constexpr int64_t width = VB / sizeof(s_t);
  int64_t i = 0;
  if (g_cols % (2 * width) == 0) {
    for (; i + 4 <= m; i += 4) {
      gemm_block<s_t, VB, 4, 2, acc>(i, a, sm, sk, kk, b, ldb, c, ldc, g_cols);
    }
    for (; i < m; ++i) gemm_block<s_t, VB, 1, 2, acc>(i, a, sm, sk, kk, b, ldb, c, ldc, g_cols);
  } else {
    for (; i + 4 <= m; i += 4) {
      gemm_block<s_t, VB, 4, 1, acc>(i, a, sm, sk, kk, b, ldb, c, ldc, g_cols);
    }
    for (; i < m; ++i) gemm_block<s_t, VB, 1, 1, acc>(i, a, sm, sk, kk, b, ldb, c, ldc, g_cols);
  }
}

#define RECURRL_GEMM_ARGS                                                                    \
  int64_t m, const s_t *a, int64_t sm, int64_t sk, int64_t kk, const s_t *b, int64_t ldb,   \
      s_t *c, int64_t ldc, int64_t g_cols
#define RECURRL_GEMM_PASS m, a, sm, sk, kk, b, ldb, c, ldc, g_cols

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define RECURRL_GEMM_DISPATCH 1
template <typename s_t, bool acc>
__attribute__((target("avx512f,avx2,fma"))) void gemm_avx512(RECURRL_GEMM_ARGS) {
  gemm_rows<s_t, 64, acc>(RECURRL_GEMM_PASS);
}
template <typename s_t, bool acc>
__attribute__((target("avx2,fma"))) void gemm_avx2(RECURRL_GEMM_ARGS) {
  gemm_rows<s_t, 32, acc>(RECURRL_GEMM_PASS);
}
#endif

// The widest vector the CPU runs (0: 16 bytes, 1: AVX2+FMA, 2: AVX-512), capped by
// RECURRL_EXT_GEMM_LEVEL (read at each fused op call; for tests of the narrower paths).
thread_local int g_gemm_level = 0;

void read_gemm_level() {
  int level = 0;
#ifdef RECURRL_GEMM_DISPATCH
  static const int cpu = __builtin_cpu_supports("avx512f")                               ? 2
                         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1
                                                                                          : 0;
  level = cpu;
#endif
  const char* cap = std::getenv("RECURRL_EXT_GEMM_LEVEL");
  if (cap != nullptr && cap[0] >= '0' && cap[0] <= '2') level = std::min(level, cap[0] - '0');
  g_gemm_level = level;
}

// C (+)= A B as above: C's rows overwritten (acc false) or added to (acc true).
template <typename s_t, bool acc>
void small_gemm(RECURRL_GEMM_ARGS) {
  if (m == 0 || g_cols == 0) return;
#ifdef RECURRL_GEMM_DISPATCH
  if (g_gemm_level == 2) return gemm_avx512<s_t, acc>(RECURRL_GEMM_PASS);
  if (g_gemm_level == 1) return gemm_avx2<s_t, acc>(RECURRL_GEMM_PASS);
#endif
  gemm_rows<s_t, 16, acc>(RECURRL_GEMM_PASS);
}

// ------------------------------------------------------------------------------- minGRU
// xp holds the projections without their bias; b [2H] is added in the loop (zeros when
// the layer has none), so that backward sums the bias's gradient in its loop too.
// One row of one step: x holds k at [0, H) and h~ at [co, co + H) (co = H in xp's layout,
// the padded width in the fused ops' scratch), p the previous state (or the stored one).
template <typename s_t>
RECURRL_INLINE void mingru_forward_row(const s_t* __restrict__ x, int64_t co,
                                       const s_t* __restrict__ b, const s_t* __restrict__ p,
                                       s_t* __restrict__ out, int64_t hid) {
#pragma GCC ivdep
  for (int64_t j = 0; j < hid; ++j) {
    s_t z, a;
    gates(x[j] + b[j], z, a);
    out[j] = a * p[j] + z * (x[co + j] + b[hid + j]);
  }
}

template <typename s_t>
RECURRL_VECTOR_CLONES void mingru_forward_kernel(const s_t* __restrict__ xp, int64_t xs,
                                                 const s_t* __restrict__ b,
                                                 const s_t* __restrict__ st, int64_t ss,
                                                 const bool* __restrict__ reset,
                                                 s_t* __restrict__ h, int64_t steps, int64_t n,
                                                 int64_t hid) {
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = t * n + r;
      const s_t* p = (t == 0 || reset[row]) ? st + row * ss : h + (row - n) * hid;
      mingru_forward_row(xp + row * xs, hid, b, p, h + row * hid, hid);
    }
  }
}

// One row of one step backwards: g = grad_h + carry; writes d_xp's row, adds it to the
// row's bias-gradient sums (acc [2H]), and writes either the carry for step t - 1 (a g) or,
// at a restart, the stored state's gradient (a g) and an exactly zero carry (selected:
// nothing flows into the previous trajectory).
// x and dk (d_xp's row) hold their k | h~ halves co apart, as in mingru_forward_row.
template <typename s_t, bool restart>
RECURRL_INLINE void mingru_backward_row(const s_t* __restrict__ x, int64_t co,
                                        const s_t* __restrict__ b, const s_t* __restrict__ p,
                                        const s_t* __restrict__ g_in, s_t* __restrict__ c,
                                        s_t* __restrict__ dk, s_t* __restrict__ ds,
                                        s_t* __restrict__ acc, int64_t hid) {
  s_t* __restrict__ dc = dk + co;
#pragma GCC ivdep
  for (int64_t j = 0; j < hid; ++j) {
    s_t z, a;
    gates(x[j] + b[j], z, a);
    const s_t g = g_in[j] + c[j];
    const s_t dcand = z * g;
    const s_t dkj = a * dcand * (x[co + j] + b[hid + j] - p[j]);  // a z (h~ - p) g
    dc[j] = dcand;
    dk[j] = dkj;
    acc[j] += dkj;
    acc[hid + j] += dcand;
    if constexpr (restart) {
      ds[j] = a * g;
      c[j] = s_t(0);
    } else {
      c[j] = a * g;
    }
  }
}

template <typename s_t>
RECURRL_VECTOR_CLONES void mingru_backward_kernel(
    const s_t* __restrict__ gh, int64_t gt, int64_t gn, const s_t* __restrict__ xp, int64_t xs,
    const s_t* __restrict__ b, const s_t* __restrict__ h, const s_t* __restrict__ st, int64_t ss,
    const bool* __restrict__ reset, s_t* __restrict__ dxp, s_t* __restrict__ dst,
    s_t* __restrict__ acc, int64_t steps, int64_t n, int64_t hid) {
  // carry[r]: the gradient reaching h_t of row r from step t + 1; scratch: where a restart's
  // stored-state gradient goes when it is not wanted; acc [N, 2H]: the bias's gradient
  std::vector<s_t> carry_buf(n * hid, s_t(0)), scratch(hid);
  s_t* carry = carry_buf.data();
  for (int64_t t = steps - 1; t >= 0; --t) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = t * n + r;
      const s_t* x = xp + row * xs;
      const s_t* g_in = gh + t * gt + r * gn;
      s_t* dk = dxp + row * 2 * hid;
      s_t* c = carry + r * hid;
      s_t* a_r = acc + r * 2 * hid;
      if (t == 0 || reset[row]) {
        s_t* ds = dst ? dst + row * hid : scratch.data();
        mingru_backward_row<s_t, true>(x, hid, b, st + row * ss, g_in, c, dk, ds, a_r, hid);
      } else {
        if (dst) {
          for (int64_t j = 0; j < hid; ++j) dst[row * hid + j] = s_t(0);
        }
        mingru_backward_row<s_t, false>(x, hid, b, h + (row - n) * hid, g_in, c, dk, nullptr,
                                        a_r, hid);
      }
    }
  }
}

// the bias [2H], or zeros for a layer without one
at::Tensor bias_or_zeros(const std::optional<at::Tensor>& bias, const at::Tensor& like,
                         int64_t size, const char* op) {
  if (!bias.has_value() || !bias->defined()) return at::zeros({size}, like.options());
  check_same(*bias, like, "bias", op);
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == size, op, ": expected bias of shape [",
              size, "], received ", bias->sizes());
  return bias->contiguous();
}

int64_t mingru_hidden(const at::Tensor& xp, const char* op) {
  TORCH_CHECK(xp.size(2) % 2 == 0, op, ": expected xp [T, N, 2H], received ", xp.sizes());
  return xp.size(2) / 2;
}

at::Tensor linear_mingru_forward(const at::Tensor& xp_in, const std::optional<at::Tensor>& bias,
                                 const at::Tensor& stored_in, const at::Tensor& reset_in) {
  static constexpr const char* op = "linear_mingru_forward";
  check_common(xp_in, reset_in, op);
  check_same(stored_in, xp_in, "stored", op);
  const int64_t steps = xp_in.size(0), n = xp_in.size(1), hid = mingru_hidden(xp_in, op);
  const at::Tensor b = bias_or_zeros(bias, xp_in, 2 * hid, op);
  auto [xp, xs] = rows_of(xp_in, "xp", steps, n, 2 * hid);
  auto [st, ss] = rows_of(stored_in, "stored", steps, n, hid, true);
  const at::Tensor reset = reset_in.contiguous();
  at::Tensor h = at::empty({steps, n, hid}, xp.options());
  if (h.numel() == 0) return h;
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), op, [&] {
    mingru_forward_kernel<scalar_t>(xp.const_data_ptr<scalar_t>(), xs, b.const_data_ptr<scalar_t>(),
                                    st.const_data_ptr<scalar_t>(), ss,
                                    reset.const_data_ptr<bool>(), h.mutable_data_ptr<scalar_t>(),
                                    steps, n, hid);
  });
  return h;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_mingru_backward(
    const at::Tensor& grad_in, const at::Tensor& xp_in, const std::optional<at::Tensor>& bias,
    const at::Tensor& h_in, const at::Tensor& stored_in, const at::Tensor& reset_in,
    bool stored_grad) {
  static constexpr const char* op = "linear_mingru_backward";
  check_common(xp_in, reset_in, op);
  const int64_t steps = xp_in.size(0), n = xp_in.size(1), hid = mingru_hidden(xp_in, op);
  for (auto* t : {&grad_in, &h_in, &stored_in}) check_same(*t, xp_in, "every tensor", op);
  const at::Tensor b = bias_or_zeros(bias, xp_in, 2 * hid, op);
  auto [xp, xs] = rows_of(xp_in, "xp", steps, n, 2 * hid);
  auto [st, ss] = rows_of(stored_in, "stored", steps, n, hid, true);
  TORCH_CHECK(grad_in.sizes() == h_in.sizes() && h_in.size(0) == steps && h_in.size(1) == n &&
                  h_in.size(2) == hid,
              op, ": expected grad_h and h of shape [", steps, ", ", n, ", ", hid, "]");
  auto [g, gt, gn] = grad_rows(grad_in);
  const at::Tensor h = h_in.contiguous(), reset = reset_in.contiguous();
  at::Tensor dxp = at::empty({steps, n, 2 * hid}, g.options());
  at::Tensor dst = at::empty({stored_grad ? steps : 0, n, hid}, g.options());
  at::Tensor acc = at::zeros({n, 2 * hid}, g.options());
  if (dxp.numel() == 0) return {dxp, dst.zero_(), acc.sum(0)};
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), op, [&] {
    mingru_backward_kernel<scalar_t>(
        g.const_data_ptr<scalar_t>(), gt, gn, xp.const_data_ptr<scalar_t>(), xs,
        b.const_data_ptr<scalar_t>(), h.const_data_ptr<scalar_t>(),
        st.const_data_ptr<scalar_t>(), ss, reset.const_data_ptr<bool>(),
        dxp.mutable_data_ptr<scalar_t>(), stored_grad ? dst.mutable_data_ptr<scalar_t>() : nullptr,
        acc.mutable_data_ptr<scalar_t>(), steps, n, hid);
  });
  return {dxp, dst, acc.sum(0)};
}

// ----------------------------------------------------------------- minGRU, projected
// The layer's whole step from its input x [T, N, F] and weight [2H, F]: per step the
// projection of the step's N rows into a scratch [N, 2Hp] (k at [0, Hp), h~ at [Hp, Hp + H),
// Hp = H padded to the widest vector), then the rows of the loop above. Nothing [T, N, 2H]
// is written: backward projects again the same way, writes the step's d_xp rows into a
// second scratch and turns them at once into d_x's rows (d_xp W) and into the weight's
// gradient (x_t^T d_xp, summed over steps in an [F, 2Hp] accumulator).

// the weight [2H, F] (strides w0, w1) as wt [F, 2Hp] (transposed, for the projection) and/or
// wp [2Hp, Fp] (for d_x = d_xp W), zero in the padding
template <typename s_t>
void pad_weight(const s_t* w, int64_t w0, int64_t w1, int64_t hid, int64_t hp, int64_t f,
                int64_t fp, s_t* wt, s_t* wp) {
  for (int64_t half = 0; half < 2; ++half) {
    for (int64_t j = 0; j < hid; ++j) {
      for (int64_t k = 0; k < f; ++k) {
        const s_t v = w[(half * hid + j) * w0 + k * w1];
        if (wt) wt[k * 2 * hp + half * hp + j] = v;
        if (wp) wp[(half * hp + j) * fp + k] = v;
      }
    }
  }
}

// Rows are independent: each runs through all its steps before the next (one sequential
// stream per tensor, whatever the layout: batch-major data read step by step across rows
// was twice as slow), kBlockSteps steps' projections at a time.
constexpr int64_t kBlockSteps = 16;

template <typename s_t>
RECURRL_VECTOR_CLONES void mingru_fused_forward_kernel(
    const s_t* x, int64_t xt, int64_t xn, int64_t f, const s_t* wt, int64_t hp, const s_t* b,
    const s_t* st, int64_t sst, int64_t ssn, const bool* reset, s_t* h, int64_t ht, int64_t hn,
    int64_t steps, int64_t n, int64_t hid, s_t* xs) {
  const int64_t xw = 2 * hp;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t t0 = 0; t0 < steps; t0 += kBlockSteps) {
      const int64_t tb = std::min(kBlockSteps, steps - t0);
      small_gemm<s_t, false>(tb, x + t0 * xt + r * xn, xt, 1, f, wt, xw, xs, xw, xw);
      for (int64_t i = 0; i < tb; ++i) {
        const int64_t t = t0 + i;
        const s_t* p = (t == 0 || reset[t * n + r]) ? st + t * sst + r * ssn
                                                    : h + (t - 1) * ht + r * hn;
        mingru_forward_row(xs + i * xw, hp, b, p, h + t * ht + r * hn, hid);
      }
    }
  }
}

// dx (strides dxt, dxn) and dwt [F, 2Hp] are written when not null; acc [N, 2H] sums the
// bias's gradient, dst as in mingru_backward_kernel.
template <typename s_t>
RECURRL_VECTOR_CLONES void mingru_fused_backward_kernel(
    const s_t* gh, int64_t gt, int64_t gn, const s_t* x, int64_t xt, int64_t xn, int64_t f,
    const s_t* wt, const s_t* wp, int64_t hp, int64_t fp, const s_t* b, const s_t* h,
    int64_t ht, int64_t hn, const s_t* st, int64_t sst, int64_t ssn, const bool* reset,
    s_t* dx, int64_t dxt, int64_t dxn, s_t* dwt, s_t* dst, s_t* acc, int64_t steps, int64_t n,
    int64_t hid) {
  const int64_t xw = 2 * hp;
  // dxs's padding stays zero: d_x's matmul reads it (against wp's zero rows)
  std::vector<s_t> carry(hid), scratch(hid), xs(kBlockSteps * xw),
      dxs(kBlockSteps * xw, s_t(0)), dxo(dx ? kBlockSteps * fp : 0);
  s_t* c = carry.data();
  for (int64_t r = 0; r < n; ++r) {
    std::fill(carry.begin(), carry.end(), s_t(0));
    s_t* a_r = acc + r * 2 * hid;
    for (int64_t t_end = steps; t_end > 0; t_end -= kBlockSteps) {
      const int64_t t0 = std::max<int64_t>(0, t_end - kBlockSteps), tb = t_end - t0;
      const s_t* x_blk = x + t0 * xt + r * xn;
      small_gemm<s_t, false>(tb, x_blk, xt, 1, f, wt, xw, xs.data(), xw, xw);
      for (int64_t i = tb - 1; i >= 0; --i) {
        const int64_t t = t0 + i, row = t * n + r;
        const s_t* xr = xs.data() + i * xw;
        const s_t* g_in = gh + t * gt + r * gn;
        s_t* dk = dxs.data() + i * xw;
        if (t == 0 || reset[row]) {
          s_t* ds = dst ? dst + row * hid : scratch.data();
          mingru_backward_row<s_t, true>(xr, hp, b, st + t * sst + r * ssn, g_in, c, dk, ds,
                                         a_r, hid);
        } else {
          if (dst) {
            for (int64_t j = 0; j < hid; ++j) dst[row * hid + j] = s_t(0);
          }
          mingru_backward_row<s_t, false>(xr, hp, b, h + (t - 1) * ht + r * hn, g_in, c, dk,
                                          nullptr, a_r, hid);
        }
      }
      if (dx) {
        small_gemm<s_t, false>(tb, dxs.data(), xw, 1, xw, wp, fp, dxo.data(), fp, fp);
        for (int64_t i = 0; i < tb; ++i) {
          s_t* out = dx + (t0 + i) * dxt + r * dxn;
          for (int64_t k = 0; k < f; ++k) out[k] = dxo[i * fp + k];
        }
      }
      if (dwt) small_gemm<s_t, true>(f, x_blk, 1, xt, tb, dxs.data(), xw, dwt, xw, xw);
    }
  }
}

// [T, N, C] for an op's output: batch-major memory ([N, T, C] transposed) when x's is, so
// that a batch-first caller gets a contiguous tensor back
at::Tensor like_rows(const at::Tensor& x, int64_t cols) {
  if (x.size(0) > 1 && x.size(1) > 1 && x.stride(0) < x.stride(1)) {
    return at::empty({x.size(1), x.size(0), cols}, x.options()).transpose(0, 1);
  }
  return at::empty({x.size(0), x.size(1), cols}, x.options());
}

int64_t mingru_fused_checks(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& stored, const at::Tensor& reset, const char* op) {
  check_common(x, reset, op);
  check_same(weight, x, "weight", op);
  check_same(stored, x, "stored", op);
  const int64_t f = x.size(2);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == f && weight.size(0) % 2 == 0, op,
              ": expected weight of shape [2H, ", f, "], received ", weight.sizes());
  const int64_t hid = weight.size(0) / 2;
  TORCH_CHECK(stored.dim() == 3 && stored.size(0) == x.size(0) && stored.size(1) == x.size(1) &&
                  stored.size(2) == hid,
              op, ": expected stored of shape [", x.size(0), ", ", x.size(1), ", ", hid,
              "], received ", stored.sizes());
  return hid;
}

at::Tensor linear_mingru_fused_forward(const at::Tensor& x_in, const at::Tensor& weight,
                                       const std::optional<at::Tensor>& bias,
                                       const at::Tensor& stored_in, const at::Tensor& reset_in) {
  static constexpr const char* op = "linear_mingru_fused_forward";
  read_gemm_level();
  const int64_t hid = mingru_fused_checks(x_in, weight, stored_in, reset_in, op);
  const int64_t steps = x_in.size(0), n = x_in.size(1), f = x_in.size(2);
  const at::Tensor b = bias_or_zeros(bias, x_in, 2 * hid, op);
  auto [x, xt, xn] = grad_rows(x_in);
  auto [st, sst, ssn] = grad_rows(stored_in);
  const at::Tensor reset = reset_in.contiguous();
  at::Tensor h = like_rows(x_in, hid);
  if (h.numel() == 0) return h;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), op, [&] {
    const int64_t hp = padded<scalar_t>(hid);
    std::vector<scalar_t> wt(f * 2 * hp, scalar_t(0)), xs(kBlockSteps * 2 * hp);
    pad_weight<scalar_t>(weight.const_data_ptr<scalar_t>(), weight.stride(0), weight.stride(1),
                         hid, hp, f, 0, wt.data(), nullptr);
    mingru_fused_forward_kernel<scalar_t>(
        x.const_data_ptr<scalar_t>(), xt, xn, f, wt.data(), hp, b.const_data_ptr<scalar_t>(),
        st.const_data_ptr<scalar_t>(), sst, ssn, reset.const_data_ptr<bool>(),
        h.mutable_data_ptr<scalar_t>(), h.stride(0), h.stride(1), steps, n, hid, xs.data());
  });
  return h;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_mingru_fused_backward(
    const at::Tensor& grad_in, const at::Tensor& x_in, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& h_in, const at::Tensor& stored_in,
    const at::Tensor& reset_in, bool x_grad, bool weight_grad, bool stored_grad) {
  static constexpr const char* op = "linear_mingru_fused_backward";
  read_gemm_level();
  const int64_t hid = mingru_fused_checks(x_in, weight, stored_in, reset_in, op);
  const int64_t steps = x_in.size(0), n = x_in.size(1), f = x_in.size(2);
  for (auto* t : {&grad_in, &h_in}) check_same(*t, x_in, "every tensor", op);
  TORCH_CHECK(grad_in.dim() == 3 && grad_in.sizes() == h_in.sizes() && h_in.size(0) == steps &&
                  h_in.size(1) == n && h_in.size(2) == hid,
              op, ": expected grad_h and h of shape [", steps, ", ", n, ", ", hid, "]");
  const at::Tensor b = bias_or_zeros(bias, x_in, 2 * hid, op);
  auto [x, xt, xn] = grad_rows(x_in);
  auto [st, sst, ssn] = grad_rows(stored_in);
  auto [g, gt, gn] = grad_rows(grad_in);
  auto [h, ht, hn] = grad_rows(h_in);
  const at::Tensor reset = reset_in.contiguous();
  at::Tensor dx = x_grad ? like_rows(x_in, f) : at::empty({0, n, f}, x_in.options());
  at::Tensor dw = at::zeros({weight_grad ? 2 * hid : 0, f}, x_in.options());
  at::Tensor dst = at::empty({stored_grad ? steps : 0, n, hid}, x_in.options());
  at::Tensor acc = at::zeros({n, 2 * hid}, x_in.options());
  if (steps == 0 || n == 0 || hid == 0) {
    return {x_grad ? dx.zero_() : dx, dw, acc.sum(0), dst.zero_()};
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), op, [&] {
    const int64_t hp = padded<scalar_t>(hid), fp = padded<scalar_t>(f);
    std::vector<scalar_t> wt(f * 2 * hp, scalar_t(0)), wp(x_grad ? 2 * hp * fp : 0, scalar_t(0)),
        dwt(weight_grad ? f * 2 * hp : 0, scalar_t(0));
    pad_weight<scalar_t>(weight.const_data_ptr<scalar_t>(), weight.stride(0), weight.stride(1),
                         hid, hp, f, fp, wt.data(), x_grad ? wp.data() : nullptr);
    mingru_fused_backward_kernel<scalar_t>(
        g.const_data_ptr<scalar_t>(), gt, gn, x.const_data_ptr<scalar_t>(), xt, xn, f,
        wt.data(), wp.data(), hp, fp, b.const_data_ptr<scalar_t>(),
        h.const_data_ptr<scalar_t>(), ht, hn, st.const_data_ptr<scalar_t>(), sst, ssn,
        reset.const_data_ptr<bool>(), x_grad ? dx.mutable_data_ptr<scalar_t>() : nullptr,
        x_grad ? dx.stride(0) : 0, x_grad ? dx.stride(1) : 0,
        weight_grad ? dwt.data() : nullptr,
        stored_grad ? dst.mutable_data_ptr<scalar_t>() : nullptr,
        acc.mutable_data_ptr<scalar_t>(), steps, n, hid);
    if (weight_grad) {
      scalar_t* d = dw.mutable_data_ptr<scalar_t>();
      for (int64_t half = 0; half < 2; ++half) {
        for (int64_t j = 0; j < hid; ++j) {
          for (int64_t k = 0; k < f; ++k) {
            d[(half * hid + j) * f + k] = dwt[k * 2 * hp + half * hp + j];
          }
        }
      }
    }
  });
  return {dx, dw, acc.sum(0), dst};
}

// ---------------------------------------------------------------------------------- LRU
// h = [Re | Im] (each H wide) per row; lambda = lr + i li, p the previous state:
//   h_re = lr p_re - li p_im + gamma bx_re,  h_im = lr p_im + li p_re + gamma bx_im
template <typename s_t>
RECURRL_VECTOR_CLONES void lru_forward_kernel(const s_t* __restrict__ bx, int64_t xs,
                                              const s_t* __restrict__ st, int64_t ss,
                                              const bool* __restrict__ reset,
                                              const s_t* __restrict__ lr,
                                              const s_t* __restrict__ li,
                                              const s_t* __restrict__ gm, s_t* __restrict__ h,
                                              int64_t steps, int64_t n, int64_t hid) {
  const int64_t hs = 2 * hid;
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = t * n + r;
      const s_t* __restrict__ x = bx + row * xs;
      const s_t* __restrict__ p = (t == 0 || reset[row]) ? st + row * ss : h + (row - n) * hs;
      s_t* __restrict__ out = h + row * hs;
#pragma GCC ivdep
      for (int64_t j = 0; j < hid; ++j) {
        const s_t pr = p[j], pi = p[hid + j];
        out[j] = lr[j] * pr - li[j] * pi + gm[j] * x[j];
        out[hid + j] = lr[j] * pi + li[j] * pr + gm[j] * x[hid + j];
      }
    }
  }
}

// One row of one step backwards (see mingru_backward_row); acc_* the running sums over time
// of the parameter gradients of this row.
template <typename s_t, bool restart>
RECURRL_INLINE void lru_backward_row(const s_t* __restrict__ x, const s_t* __restrict__ p,
                             const s_t* __restrict__ g_in, s_t* __restrict__ c,
                             s_t* __restrict__ dx, s_t* __restrict__ ds,
                             const s_t* __restrict__ lr, const s_t* __restrict__ li,
                             const s_t* __restrict__ gm, s_t* __restrict__ a_lr,
                             s_t* __restrict__ a_li, s_t* __restrict__ a_gm, int64_t hid) {
#pragma GCC ivdep
  for (int64_t j = 0; j < hid; ++j) {
    const s_t gr = g_in[j] + c[j], gi = g_in[hid + j] + c[hid + j];
    const s_t pr = p[j], pi = p[hid + j];
    dx[j] = gm[j] * gr;
    dx[hid + j] = gm[j] * gi;
    a_lr[j] += gr * pr + gi * pi;
    a_li[j] += gi * pr - gr * pi;
    a_gm[j] += gr * x[j] + gi * x[hid + j];
    // the gradient of p: conj(lambda) g
    const s_t dpr = lr[j] * gr + li[j] * gi, dpi = lr[j] * gi - li[j] * gr;
    if constexpr (restart) {
      ds[j] = dpr;
      ds[hid + j] = dpi;
      c[j] = s_t(0);
      c[hid + j] = s_t(0);
    } else {
      c[j] = dpr;
      c[hid + j] = dpi;
    }
  }
}

// acc: [3, N, H] running sums over time of the parameter gradients (lr, li, gamma)
template <typename s_t>
RECURRL_VECTOR_CLONES void lru_backward_kernel(
    const s_t* __restrict__ gh, const s_t* __restrict__ bx, int64_t xs, const s_t* __restrict__ h,
    const s_t* __restrict__ st, int64_t ss, const bool* __restrict__ reset,
    const s_t* __restrict__ lr, const s_t* __restrict__ li, const s_t* __restrict__ gm,
    s_t* __restrict__ dbx, int64_t dxs, const s_t* __restrict__ rest, int64_t rt, int64_t rn,
    int64_t extra,
    s_t* __restrict__ dst, s_t* __restrict__ acc, int64_t steps, int64_t n, int64_t hid) {
  // dbx's rows are dxs wide: the 2H gradients of bx, then the `extra` columns of `rest`
  const int64_t hs = 2 * hid;
  std::vector<s_t> carry_buf(n * hs, s_t(0)), scratch(hs);
  s_t* carry = carry_buf.data();
  for (int64_t t = steps - 1; t >= 0; --t) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = t * n + r;
      const s_t* x = bx + row * xs;
      const s_t* g_in = gh + row * hs;
      s_t* dx = dbx + row * dxs;
      for (int64_t j = 0; j < extra; ++j) dx[hs + j] = rest[t * rt + r * rn + j];
      s_t *a_lr = acc + r * hid, *a_li = acc + (n + r) * hid, *a_gm = acc + (2 * n + r) * hid;
      if (t == 0 || reset[row]) {
        s_t* ds = dst ? dst + row * hs : scratch.data();
        lru_backward_row<s_t, true>(x, st + row * ss, g_in, carry + r * hs, dx, ds, lr, li, gm,
                                    a_lr, a_li, a_gm, hid);
      } else {
        if (dst) {
          for (int64_t j = 0; j < hs; ++j) dst[row * hs + j] = s_t(0);
        }
        lru_backward_row<s_t, false>(x, h + (row - n) * hs, g_in, carry + r * hs, dx, nullptr,
                                     lr, li, gm, a_lr, a_li, a_gm, hid);
      }
    }
  }
}

void check_lambda(const at::Tensor& v, const at::Tensor& like, int64_t hid, const char* name,
                  const char* op) {
  check_same(v, like, name, op);
  TORCH_CHECK(v.dim() == 1 && v.size(0) == hid, op, ": expected ", name, " of shape [", hid,
              "], received ", v.sizes());
}

int64_t lru_hidden(const at::Tensor& bx, const at::Tensor& lam_re, const char* op) {
  TORCH_CHECK(lam_re.dim() == 1, op, ": expected lam_re [H], received ", lam_re.sizes());
  const int64_t hid = lam_re.size(0);
  TORCH_CHECK(bx.size(2) >= 2 * hid, op, ": expected bx [T, N, >=2H] with H = ", hid,
              ", received ", bx.sizes());
  return hid;
}

at::Tensor linear_lru_forward(const at::Tensor& bx_in, const at::Tensor& stored_in,
                              const at::Tensor& reset_in, const at::Tensor& lam_re_in,
                              const at::Tensor& lam_im_in, const at::Tensor& gamma_in) {
  static constexpr const char* op = "linear_lru_forward";
  check_common(bx_in, reset_in, op);
  const int64_t steps = bx_in.size(0), n = bx_in.size(1);
  const int64_t hid = lru_hidden(bx_in, lam_re_in, op);
  check_same(stored_in, bx_in, "stored", op);
  check_lambda(lam_re_in, bx_in, hid, "lam_re", op);
  check_lambda(lam_im_in, bx_in, hid, "lam_im", op);
  check_lambda(gamma_in, bx_in, hid, "gamma", op);
  auto [bx, xs] = rows_of(bx_in, "bx", steps, n, 2 * hid);
  auto [st, ss] = rows_of(stored_in, "stored", steps, n, 2 * hid, true);
  const at::Tensor reset = reset_in.contiguous(), lr = lam_re_in.contiguous(),
                   li = lam_im_in.contiguous(), gm = gamma_in.contiguous();
  at::Tensor h = at::empty({steps, n, 2 * hid}, bx.options());
  if (h.numel() == 0) return h;
  AT_DISPATCH_FLOATING_TYPES(bx.scalar_type(), op, [&] {
    lru_forward_kernel<scalar_t>(bx.const_data_ptr<scalar_t>(), xs, st.const_data_ptr<scalar_t>(),
                                 ss, reset.const_data_ptr<bool>(), lr.const_data_ptr<scalar_t>(),
                                 li.const_data_ptr<scalar_t>(), gm.const_data_ptr<scalar_t>(),
                                 h.mutable_data_ptr<scalar_t>(), steps, n, hid);
  });
  return h;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_lru_backward(
    const at::Tensor& grad_in, const at::Tensor& bx_in, const at::Tensor& h_in,
    const at::Tensor& stored_in, const at::Tensor& reset_in, const at::Tensor& lam_re_in,
    const at::Tensor& lam_im_in, const at::Tensor& gamma_in, bool stored_grad,
    const std::optional<at::Tensor>& grad_rest) {
  static constexpr const char* op = "linear_lru_backward";
  check_common(bx_in, reset_in, op);
  const int64_t steps = bx_in.size(0), n = bx_in.size(1);
  const int64_t hid = lru_hidden(bx_in, lam_re_in, op);
  for (auto* t : {&grad_in, &h_in, &stored_in}) check_same(*t, bx_in, "every tensor", op);
  check_lambda(lam_re_in, bx_in, hid, "lam_re", op);
  check_lambda(lam_im_in, bx_in, hid, "lam_im", op);
  check_lambda(gamma_in, bx_in, hid, "gamma", op);
  TORCH_CHECK(grad_in.sizes() == h_in.sizes() && h_in.size(0) == steps && h_in.size(1) == n &&
                  h_in.size(2) == 2 * hid,
              op, ": expected grad_h and h of shape [", steps, ", ", n, ", ", 2 * hid, "]");
  auto [bx, xs] = rows_of(bx_in, "bx", steps, n, 2 * hid);
  auto [st, ss] = rows_of(stored_in, "stored", steps, n, 2 * hid, true);
  const at::Tensor g = grad_in.contiguous(), h = h_in.contiguous(), reset = reset_in.contiguous(),
                   lr = lam_re_in.contiguous(), li = lam_im_in.contiguous(),
                   gm = gamma_in.contiguous();
  const bool has_rest = grad_rest.has_value() && grad_rest->defined();
  at::Tensor rest_in = has_rest ? *grad_rest : at::empty({steps, n, 0}, g.options());
  check_same(rest_in, bx_in, "grad_rest", op);
  TORCH_CHECK(rest_in.dim() == 3, op, ": expected grad_rest [T, N, E], received ", rest_in.sizes());
  const int64_t extra = rest_in.size(2);
  TORCH_CHECK(rest_in.size(0) == steps && rest_in.size(1) == n, op,
              ": expected grad_rest of shape [", steps, ", ", n, ", E], received ",
              rest_in.sizes());
  auto [rest, rt, rn] = grad_rows(rest_in);
  at::Tensor dbx = at::empty({steps, n, 2 * hid + extra}, g.options());
  at::Tensor dst = at::empty({stored_grad ? steps : 0, n, 2 * hid}, g.options());
  at::Tensor acc = at::zeros({3, n, hid}, g.options());
  if (dbx.numel() == 0) {
    at::Tensor zero = at::zeros({hid}, g.options());
    return {dbx, dst.zero_(), zero, zero.clone(), zero.clone()};
  }
  AT_DISPATCH_FLOATING_TYPES(bx.scalar_type(), op, [&] {
    lru_backward_kernel<scalar_t>(
        g.const_data_ptr<scalar_t>(), bx.const_data_ptr<scalar_t>(), xs,
        h.const_data_ptr<scalar_t>(), st.const_data_ptr<scalar_t>(), ss,
        reset.const_data_ptr<bool>(), lr.const_data_ptr<scalar_t>(),
        li.const_data_ptr<scalar_t>(), gm.const_data_ptr<scalar_t>(),
        dbx.mutable_data_ptr<scalar_t>(), 2 * hid + extra, rest.const_data_ptr<scalar_t>(), rt,
        rn, extra, stored_grad ? dst.mutable_data_ptr<scalar_t>() : nullptr,
        acc.mutable_data_ptr<scalar_t>(), steps, n, hid);
  });
  at::Tensor sums = acc.sum(1);  // [3, H]
  return {dbx, dst, sums[0], sums[1], sums[2]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(recurrl, m) {
  m.def("linear_mingru_forward(Tensor xp, Tensor? bias, Tensor stored, Tensor reset) -> Tensor",
        &linear_mingru_forward);
  m.def(
      "linear_mingru_backward(Tensor grad_h, Tensor xp, Tensor? bias, Tensor h, Tensor stored, "
      "Tensor reset, bool stored_grad) -> (Tensor, Tensor, Tensor)",
      &linear_mingru_backward);
  m.def(
      "linear_mingru_fused_forward(Tensor x, Tensor weight, Tensor? bias, Tensor stored, "
      "Tensor reset) -> Tensor",
      &linear_mingru_fused_forward);
  m.def(
      "linear_mingru_fused_backward(Tensor grad_h, Tensor x, Tensor weight, Tensor? bias, "
      "Tensor h, Tensor stored, Tensor reset, bool x_grad, bool weight_grad, bool stored_grad) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      &linear_mingru_fused_backward);
  m.def(
      "linear_lru_forward(Tensor bx, Tensor stored, Tensor reset, Tensor lam_re, "
      "Tensor lam_im, Tensor gamma) -> Tensor",
      &linear_lru_forward);
  m.def(
      "linear_lru_backward(Tensor grad_h, Tensor bx, Tensor h, Tensor stored, Tensor reset, "
      "Tensor lam_re, Tensor lam_im, Tensor gamma, bool stored_grad, Tensor? grad_rest) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)",
      &linear_lru_backward);
}
