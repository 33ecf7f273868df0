// Reset-aware LSTM and GRU layers over time-major [T, N, *] sequences: the ``cpp`` recurrent
// backend (recurrl/functional/recurrent/cpp.py), the algorithm of the ``scan`` backend's fused
// loops (recurrl/functional/recurrent/scan.py) without Python's per-op dispatch.
//
// Per step, forward: one matmul for the recurrent projection, then ONE pointwise loop over the
// rows that applies the gates, updates the state and selects the next step's incoming state
// (``reset ? stored : carried``, a select, so a NaN in a carried state never crosses a reset).
// Backward, per step: one pointwise loop (the incoming gradient, selected at restarts, and the
// gate gradients), one matmul for the gradient flowing into the previous state; the gradient
// of ``weight_hh`` is one matmul over all steps after the loop.
//
// Inputs are contiguous CPU tensors (the Python wrapper makes them so): ``xp [T, N, G*H]`` the
// input projections, stored states ``[T, N, H]``, ``reset [T, N]`` bool (row n restarts from
// the stored state at step t; step 0 always does), ``w_hh [G*H, H]``.
//
// float32 uses vectorisable polynomial exp/tanh (Cephes, within 2 ulp; NaN propagates);
// float64 uses the standard library.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "mm_rows.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <tuple>

namespace {

using at::Tensor;

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__linux__)
#define RECURRL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RECURRL_CLONES
#endif
#if defined(__GNUC__)
#define RECURRL_INLINE __attribute__((always_inline)) inline
#else
#define RECURRL_INLINE inline
#endif

// ------------------------------------------------------------------------------ math
// The pointwise kernels below are compiled without -ftrapping-math (as torch itself is):
// it lets the compiler vectorise their selects; the results are the same.
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
RECURRL_INLINE float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// exp(x) for float, branch-free (vectorises); Cephes expf's polynomial. NaN -> NaN.
RECURRL_INLINE float exp_approx(float x) {
  float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  xc = xc == xc ? xc : 0.0f;  // NaN: computed on 0, restored below
  const float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x/ln2)
  const float r = xc - kf * 0.693359375f - kf * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t k = static_cast<int32_t>(kf);
  const float out = y * bits_to_float((k + 127) << 23);
  return x == x ? out : x;
}

RECURRL_INLINE float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// tanh(x) for float: Cephes tanhf (odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above).
RECURRL_INLINE float tanh_(float x) {
  const float a = x < 0.0f ? -x : x;
  const float big = 1.0f - 2.0f / (exp_approx(a + a) + 1.0f);
  const float z = x * x;
  const float p =
      ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
        1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  return a < 0.625f ? p : (x < 0.0f ? -big : big);
}

RECURRL_INLINE double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
RECURRL_INLINE double tanh_(double x) { return std::tanh(x); }

// ------------------------------------------------------------------------------ row kernels
// One step's gates and state update for rows [r0, r1). ``gates`` holds the recurrent
// matmul on entry, the activated gates (i, f, tanh g, o) on exit.
template <typename T>
RECURRL_INLINE void lstm_fwd_row(int64_t hid, const T* __restrict xp, T* __restrict gates,
                         const T* __restrict c_in, T* __restrict h, T* __restrict c,
                         T* __restrict tc) {
  for (int64_t j = 0; j < hid; ++j) {
    const T i = sigmoid(xp[j] + gates[j]);
    const T f = sigmoid(xp[hid + j] + gates[hid + j]);
    const T g = tanh_(xp[2 * hid + j] + gates[2 * hid + j]);
    const T o = sigmoid(xp[3 * hid + j] + gates[3 * hid + j]);
    gates[j] = i;
    gates[hid + j] = f;
    gates[2 * hid + j] = g;
    gates[3 * hid + j] = o;
    const T cc = f * c_in[j] + i * g;
    const T t = tanh_(cc);
    c[j] = cc;
    tc[j] = t;
    h[j] = o * t;
  }
}

RECURRL_CLONES void lstm_fwd_row_f(int64_t hid, const float* xp, float* gates,
                                   const float* c_in, float* h, float* c, float* tc) {
  lstm_fwd_row<float>(hid, xp, gates, c_in, h, c, tc);
}
inline void lstm_fwd_row_f(int64_t hid, const double* xp, double* gates, const double* c_in,
                    double* h, double* c, double* tc) {
  lstm_fwd_row<double>(hid, xp, gates, c_in, h, c, tc);
}

// One step's gradients for one row: ``dh``/``dc`` the incoming gradients of the step's h and
// c (the outputs' plus, when the next step carried this one, what flowed back from it).
template <typename T, bool CARRY>
RECURRL_INLINE void lstm_bwd_row(int64_t hid, const T* __restrict dho, const T* __restrict dco,
                         const T* __restrict dh_next, const T* __restrict dc_next,
                         const T* __restrict gates, const T* __restrict tc,
                         const T* __restrict c_in, T* __restrict dgates, T* __restrict dc_in) {
  for (int64_t j = 0; j < hid; ++j) {
    T dh = dho[j], dc = dco[j];
    if (CARRY) {
      dh += dh_next[j];
      dc += dc_next[j];
    }
    const T i = gates[j], f = gates[hid + j], g = gates[2 * hid + j], o = gates[3 * hid + j];
    const T t = tc[j];
    const T dct = dc + dh * (o * (T(1) - t * t));
    dgates[j] = dct * (g * i * (T(1) - i));
    dgates[hid + j] = dct * (c_in[j] * f * (T(1) - f));
    dgates[2 * hid + j] = dct * (i * (T(1) - g * g));
    dgates[3 * hid + j] = dh * (t * o * (T(1) - o));
    dc_in[j] = dct * f;
  }
}

// float: compiled for several instruction sets, picked at load time (target_clones)
#define RECURRL_LSTM_BWD(NAME, T, CARRY, ATTR)                                               \
  ATTR void NAME(int64_t hid, const T* dho, const T* dco, const T* dh_next, const T* dc_next, \
                 const T* gates, const T* tc, const T* c_in, T* dgates, T* dc_in) {          \
    lstm_bwd_row<T, CARRY>(hid, dho, dco, dh_next, dc_next, gates, tc, c_in, dgates, dc_in);  \
  }
RECURRL_LSTM_BWD(lstm_bwd_carry, float, true, RECURRL_CLONES)
RECURRL_LSTM_BWD(lstm_bwd_start, float, false, RECURRL_CLONES)
RECURRL_LSTM_BWD(lstm_bwd_carry, double, true, inline)
RECURRL_LSTM_BWD(lstm_bwd_start, double, false, inline)

// torch's GRU: r = sig(x_r + gh_r), z = sig(x_z + gh_z), n = tanh(x_n + r * gh_n),
// h = n + z * (h_in - n), with gh = h_in W_hh^T + b_hh.
template <typename T>
RECURRL_INLINE void gru_fwd_row(int64_t hid, const T* __restrict xp, const T* __restrict gh,
                        const T* __restrict b, const T* __restrict hin, T* __restrict rz,
                        T* __restrict nn, T* __restrict ghn, T* __restrict h) {
  for (int64_t j = 0; j < hid; ++j) {
    const T r = sigmoid(xp[j] + (gh[j] + b[j]));
    const T z = sigmoid(xp[hid + j] + (gh[hid + j] + b[hid + j]));
    const T gn = gh[2 * hid + j] + b[2 * hid + j];
    const T nv = tanh_(xp[2 * hid + j] + r * gn);
    rz[j] = r;
    rz[hid + j] = z;
    ghn[j] = gn;
    nn[j] = nv;
    h[j] = nv + z * (hin[j] - nv);
  }
}

RECURRL_CLONES void gru_fwd_row_f(int64_t hid, const float* xp, const float* gh, const float* b,
                                  const float* hin, float* rz, float* nn, float* ghn, float* h) {
  gru_fwd_row<float>(hid, xp, gh, b, hin, rz, nn, ghn, h);
}
inline void gru_fwd_row_f(int64_t hid, const double* xp, const double* gh, const double* b,
                   const double* hin, double* rz, double* nn, double* ghn, double* h) {
  gru_fwd_row<double>(hid, xp, gh, b, hin, rz, nn, ghn, h);
}

template <typename T, bool CARRY>
RECURRL_INLINE void gru_bwd_row(int64_t hid, const T* __restrict dho, const T* __restrict dh_next,
                        const T* __restrict hin, const T* __restrict rz,
                        const T* __restrict nn, const T* __restrict ghn, T* __restrict dgh,
                        T* __restrict dxp, T* __restrict dhz) {
  for (int64_t j = 0; j < hid; ++j) {
    T dh = dho[j];
    if (CARRY) dh += dh_next[j];
    const T r = rz[j], z = rz[hid + j], nv = nn[j];
    const T dpn = dh * ((T(1) - z) * (T(1) - nv * nv));
    const T dz = dh * ((hin[j] - nv) * z * (T(1) - z));
    const T dr = dpn * (ghn[j] * r * (T(1) - r));
    dgh[j] = dr;
    dgh[hid + j] = dz;
    dgh[2 * hid + j] = dpn * r;
    dxp[j] = dr;
    dxp[hid + j] = dz;
    dxp[2 * hid + j] = dpn;
    dhz[j] = dh * z;  // the direct path h_in -> h; the matmul adds the gates' path
  }
}

#define RECURRL_GRU_BWD(NAME, T, CARRY, ATTR)                                                \
  ATTR void NAME(int64_t hid, const T* dho, const T* dh_next, const T* hin, const T* rz,       \
                 const T* nn, const T* ghn, T* dgh, T* dxp, T* dhz) {                          \
    gru_bwd_row<T, CARRY>(hid, dho, dh_next, hin, rz, nn, ghn, dgh, dxp, dhz);                 \
  }
RECURRL_GRU_BWD(gru_bwd_carry, float, true, RECURRL_CLONES)
RECURRL_GRU_BWD(gru_bwd_start, float, false, RECURRL_CLONES)
RECURRL_GRU_BWD(gru_bwd_carry, double, true, inline)
RECURRL_GRU_BWD(gru_bwd_start, double, false, inline)

#pragma GCC pop_options

// (matmul and the rows' split over threads: mm_rows.h)
void check_inputs(const char* op, const Tensor& xp, const Tensor& reset, const Tensor& w_hh,
                  int64_t gates) {
  TORCH_CHECK(xp.device().is_cpu(), op, ": expected CPU tensors, received ", xp.device(),
              ". Fix: use recurrent_backend='pad' or 'triton' on CUDA.");
  TORCH_CHECK(xp.dim() == 3 && xp.size(2) % gates == 0, op, ": expected xp [T, N, ", gates,
              "*H], received ", xp.sizes());
  TORCH_CHECK(xp.scalar_type() == at::kFloat || xp.scalar_type() == at::kDouble, op,
              ": expected float32 or float64, received ", xp.scalar_type());
  TORCH_CHECK(reset.scalar_type() == at::kBool && reset.dim() == 2 &&
                  reset.size(0) == xp.size(0) && reset.size(1) == xp.size(1),
              op, ": expected reset [T, N] bool, received ", reset.sizes(), " ",
              reset.scalar_type());
  const int64_t hid = xp.size(2) / gates;
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(0) == gates * hid && w_hh.size(1) == hid, op,
              ": expected w_hh [", gates * hid, ", ", hid, "], received ", w_hh.sizes());
}

void check_state(const char* op, const char* name, const Tensor& s, const Tensor& xp,
                 int64_t hid) {
  TORCH_CHECK(s.dim() == 3 && s.size(0) == xp.size(0) && s.size(1) == xp.size(1) &&
                  s.size(2) == hid && s.scalar_type() == xp.scalar_type(),
              op, ": expected ", name, " [T, N, ", hid, "] of ", xp.scalar_type(),
              ", received ", s.sizes(), " of ", s.scalar_type());
}

void require_contiguous(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    TORCH_CHECK(t->is_contiguous(), op, ": expected contiguous tensors (the Python wrapper "
                "makes them so), received strides ", t->strides());
  }
}

// Rows not restarting at step t get no gradient into their stored state (selected: a NaN
// there must not leak into a stored state that is never read).
template <typename T>
void zero_unread(T* d_stored, const bool* reset, int64_t steps, int64_t n, int64_t hid) {
  for (int64_t t = 1; t < steps; ++t) {
    for (int64_t row = 0; row < n; ++row) {
      if (!reset[t * n + row]) std::memset(d_stored + (t * n + row) * hid, 0, hid * sizeof(T));
    }
  }
}

// ------------------------------------------------------------------------------ LSTM
template <typename T>
void lstm_forward_impl(const Tensor& xp_t, const Tensor& sh_t, const Tensor& sc_t,
                       const Tensor& reset_t, const Tensor& w_t, Tensor& h_t, Tensor& c_t,
                       Tensor& gates_t, Tensor& tc_t, Tensor& hin_t, Tensor& cin_t) {
  const int64_t steps = xp_t.size(0), n = xp_t.size(1), hid = sh_t.size(2), g4 = 4 * hid;
  const T* xp = xp_t.const_data_ptr<T>();
  const T* sh = sh_t.const_data_ptr<T>();
  const T* sc = sc_t.const_data_ptr<T>();
  const bool* reset = reset_t.const_data_ptr<bool>();
  const T* w = w_t.const_data_ptr<T>();
  T* h = h_t.mutable_data_ptr<T>();
  T* c = c_t.mutable_data_ptr<T>();
  T* gates = gates_t.mutable_data_ptr<T>();
  T* tc = tc_t.mutable_data_ptr<T>();
  T* hin = hin_t.mutable_data_ptr<T>();
  T* cin = cin_t.mutable_data_ptr<T>();
  const int64_t nh = n * hid;
  if (steps == 0 || n == 0) return;
  std::memcpy(hin, sh, nh * sizeof(T));
  std::memcpy(cin, sc, nh * sizeof(T));
  for_row_blocks(n, [&](int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t o = t * n + r0;
      mm<T>(false, true, r1 - r0, g4, hid, hin + o * hid, hid, w, hid, T(0), gates + o * g4, g4);
      const bool last = t + 1 == steps;
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o4 = (t * n + row) * g4, o1 = (t * n + row) * hid;
        lstm_fwd_row_f(hid, xp + o4, gates + o4, cin + o1, h + o1, c + o1, tc + o1);
        if (!last) {  // the next step's incoming state: stored at a restart, else carried
          const int64_t nxt = o1 + nh;
          const bool r = reset[(t + 1) * n + row];
          std::memcpy(hin + nxt, r ? sh + nxt : h + o1, hid * sizeof(T));
          std::memcpy(cin + nxt, r ? sc + nxt : c + o1, hid * sizeof(T));
        }
      }
    }
  });
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_scan_forward(
    const Tensor& xp, const Tensor& sh, const Tensor& sc, const Tensor& reset,
    const Tensor& w_hh) {
  const char* op = "recurrl::lstm_scan_forward";
  read_mm_setting();
  check_inputs(op, xp, reset, w_hh, 4);
  const int64_t hid = xp.size(2) / 4;
  check_state(op, "sh", sh, xp, hid);
  check_state(op, "sc", sc, xp, hid);
  TORCH_CHECK(w_hh.scalar_type() == xp.scalar_type(), op, ": w_hh dtype ", w_hh.scalar_type(),
              " differs from xp's ", xp.scalar_type());
  require_contiguous(op, {&xp, &sh, &sc, &reset, &w_hh});
  Tensor h = at::empty_like(sh), c = at::empty_like(sh), tc = at::empty_like(sh);
  Tensor hin = at::empty_like(sh), cin = at::empty_like(sh), gates = at::empty_like(xp);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "lstm_scan_forward", [&] {
    lstm_forward_impl<scalar_t>(xp, sh, sc, reset, w_hh, h, c, gates, tc, hin, cin);
  });
  return {h, c, gates, tc, hin, cin};
}

template <typename T>
void lstm_backward_impl(const Tensor& dho_t, const Tensor& dco_t, const Tensor& reset_t,
                        const Tensor& w_t, const Tensor& gates_t, const Tensor& tc_t,
                        const Tensor& hin_t, const Tensor& cin_t, Tensor& dgates_t,
                        Tensor& dsh_t, Tensor& dsc_t, Tensor& dw_t) {
  const int64_t steps = gates_t.size(0), n = gates_t.size(1), hid = tc_t.size(2), g4 = 4 * hid;
  const T* dho = dho_t.const_data_ptr<T>();
  const T* dco = dco_t.const_data_ptr<T>();
  const bool* reset = reset_t.const_data_ptr<bool>();
  const T* w = w_t.const_data_ptr<T>();
  const T* gates = gates_t.const_data_ptr<T>();
  const T* tc = tc_t.const_data_ptr<T>();
  const T* hin = hin_t.const_data_ptr<T>();
  const T* cin = cin_t.const_data_ptr<T>();
  T* dgates = dgates_t.mutable_data_ptr<T>();
  T* dsh = dsh_t.mutable_data_ptr<T>();  // per step: the gradient into h_in (all rows)
  T* dsc = dsc_t.mutable_data_ptr<T>();  // per step: the gradient into c_in (all rows)
  const int64_t nh = n * hid;
  for_row_blocks(n, [&](int64_t r0, int64_t r1) {
    for (int64_t t = steps - 1; t >= 0; --t) {
      const bool last = t + 1 == steps;
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o4 = (t * n + row) * g4, o1 = (t * n + row) * hid;
        // the next step carried this one's state unless it restarted there: selected, as
        // 0 * NaN would carry a non-finite gradient of the next trajectory back
        if (!last && !reset[(t + 1) * n + row]) {
          lstm_bwd_carry(hid, dho + o1, dco + o1, dsh + o1 + nh, dsc + o1 + nh,
                                  gates + o4, tc + o1, cin + o1, dgates + o4, dsc + o1);
        } else {
          lstm_bwd_start(hid, dho + o1, dco + o1, nullptr, nullptr, gates + o4,
                                   tc + o1, cin + o1, dgates + o4, dsc + o1);
        }
      }
      const int64_t o = t * n + r0;
      mm<T>(false, false, r1 - r0, hid, g4, dgates + o * g4, g4, w, hid, T(0), dsh + o * hid, hid);
    }
  });
  zero_unread(dsh, reset, steps, n, hid);
  zero_unread(dsc, reset, steps, n, hid);
  mm<T>(true, false, g4, hid, steps * n, dgates, g4, hin, hid, T(0),
        dw_t.mutable_data_ptr<T>(), hid);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_scan_backward(
    const Tensor& dh, const Tensor& dc, const Tensor& reset, const Tensor& w_hh,
    const Tensor& gates, const Tensor& tc, const Tensor& hin, const Tensor& cin) {
  const char* op = "recurrl::lstm_scan_backward";
  read_mm_setting();
  check_inputs(op, gates, reset, w_hh, 4);
  const int64_t hid = gates.size(2) / 4;
  for (const Tensor* s : {&dh, &dc, &tc, &hin, &cin}) check_state(op, "a state", *s, gates, hid);
  require_contiguous(op, {&dh, &dc, &reset, &w_hh, &gates, &tc, &hin, &cin});
  Tensor dgates = at::empty_like(gates), dsh = at::empty_like(tc), dsc = at::empty_like(tc);
  Tensor dw = at::zeros_like(w_hh);
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_scan_backward", [&] {
    lstm_backward_impl<scalar_t>(dh, dc, reset, w_hh, gates, tc, hin, cin, dgates, dsh, dsc,
                                 dw);
  });
  return {dgates, dsh, dsc, dw};
}

// ------------------------------------------------------------------------------ GRU
template <typename T>
void gru_forward_impl(const Tensor& xp_t, const Tensor& sh_t, const Tensor& reset_t,
                      const Tensor& w_t, const Tensor& b_t, Tensor& h_t, Tensor& hin_t,
                      Tensor& rz_t, Tensor& nn_t, Tensor& ghn_t) {
  const int64_t steps = xp_t.size(0), n = xp_t.size(1), hid = sh_t.size(2), g3 = 3 * hid;
  const T* xp = xp_t.const_data_ptr<T>();
  const T* sh = sh_t.const_data_ptr<T>();
  const bool* reset = reset_t.const_data_ptr<bool>();
  const T* w = w_t.const_data_ptr<T>();
  const T* b = b_t.const_data_ptr<T>();
  T* h = h_t.mutable_data_ptr<T>();
  T* hin = hin_t.mutable_data_ptr<T>();
  T* rz = rz_t.mutable_data_ptr<T>();
  T* nn = nn_t.mutable_data_ptr<T>();
  T* ghn = ghn_t.mutable_data_ptr<T>();
  const int64_t nh = n * hid;
  if (steps == 0 || n == 0) return;
  Tensor gh_t = at::empty({n, g3}, xp_t.options());
  T* gh = gh_t.mutable_data_ptr<T>();
  std::memcpy(hin, sh, nh * sizeof(T));
  for_row_blocks(n, [&](int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < steps; ++t) {
      mm<T>(false, true, r1 - r0, g3, hid, hin + (t * n + r0) * hid, hid, w, hid, T(0),
            gh + r0 * g3, g3);
      const bool last = t + 1 == steps;
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o3 = (t * n + row) * g3, o1 = (t * n + row) * hid;
        gru_fwd_row_f(hid, xp + o3, gh + row * g3, b, hin + o1, rz + 2 * o1, nn + o1,
                      ghn + o1, h + o1);
        if (!last) {
          const int64_t nxt = o1 + nh;
          std::memcpy(hin + nxt, reset[(t + 1) * n + row] ? sh + nxt : h + o1, hid * sizeof(T));
        }
      }
    }
  });
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gru_scan_forward(
    const Tensor& xp, const Tensor& sh, const Tensor& reset, const Tensor& w_hh,
    const std::optional<Tensor>& b_hh) {
  const char* op = "recurrl::gru_scan_forward";
  read_mm_setting();
  check_inputs(op, xp, reset, w_hh, 3);
  const int64_t hid = xp.size(2) / 3;
  check_state(op, "sh", sh, xp, hid);
  TORCH_CHECK(w_hh.scalar_type() == xp.scalar_type(), op, ": w_hh dtype ", w_hh.scalar_type(),
              " differs from xp's ", xp.scalar_type());
  Tensor b = b_hh.has_value() && b_hh->defined() ? *b_hh : at::zeros({3 * hid}, xp.options());
  TORCH_CHECK(b.dim() == 1 && b.size(0) == 3 * hid && b.scalar_type() == xp.scalar_type(), op,
              ": expected b_hh [", 3 * hid, "], received ", b.sizes());
  require_contiguous(op, {&xp, &sh, &reset, &w_hh, &b});
  Tensor h = at::empty_like(sh), hin = at::empty_like(sh), nn = at::empty_like(sh);
  Tensor ghn = at::empty_like(sh), rz = at::empty({xp.size(0), xp.size(1), 2 * hid}, xp.options());
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "gru_scan_forward", [&] {
    gru_forward_impl<scalar_t>(xp, sh, reset, w_hh, b, h, hin, rz, nn, ghn);
  });
  return {h, hin, rz, nn, ghn};
}

template <typename T>
void gru_backward_impl(const Tensor& dho_t, const Tensor& reset_t, const Tensor& w_t,
                       const Tensor& hin_t, const Tensor& rz_t, const Tensor& nn_t,
                       const Tensor& ghn_t, Tensor& dxp_t, Tensor& dsh_t, Tensor& dw_t,
                       Tensor& dgh_t) {
  const int64_t steps = hin_t.size(0), n = hin_t.size(1), hid = hin_t.size(2), g3 = 3 * hid;
  const T* dho = dho_t.const_data_ptr<T>();
  const bool* reset = reset_t.const_data_ptr<bool>();
  const T* w = w_t.const_data_ptr<T>();
  const T* hin = hin_t.const_data_ptr<T>();
  const T* rz = rz_t.const_data_ptr<T>();
  const T* nn = nn_t.const_data_ptr<T>();
  const T* ghn = ghn_t.const_data_ptr<T>();
  T* dxp = dxp_t.mutable_data_ptr<T>();
  T* dsh = dsh_t.mutable_data_ptr<T>();  // per step: the gradient into h_in (all rows)
  T* dgh = dgh_t.mutable_data_ptr<T>();
  const int64_t nh = n * hid;
  for_row_blocks(n, [&](int64_t r0, int64_t r1) {
    for (int64_t t = steps - 1; t >= 0; --t) {
      const bool last = t + 1 == steps;
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o3 = (t * n + row) * g3, o1 = (t * n + row) * hid;
        if (!last && !reset[(t + 1) * n + row]) {  // selected (see the LSTM's)
          gru_bwd_carry(hid, dho + o1, dsh + o1 + nh, hin + o1, rz + 2 * o1, nn + o1,
                                 ghn + o1, dgh + o3, dxp + o3, dsh + o1);
        } else {
          gru_bwd_start(hid, dho + o1, nullptr, hin + o1, rz + 2 * o1, nn + o1,
                                  ghn + o1, dgh + o3, dxp + o3, dsh + o1);
        }
      }
      const int64_t o = t * n + r0;
      mm<T>(false, false, r1 - r0, hid, g3, dgh + o * g3, g3, w, hid, T(1), dsh + o * hid, hid);
    }
  });
  zero_unread(dsh, reset, steps, n, hid);
  mm<T>(true, false, g3, hid, steps * n, dgh, g3, hin, hid, T(0), dw_t.mutable_data_ptr<T>(),
        hid);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> gru_scan_backward(
    const Tensor& dh, const Tensor& reset, const Tensor& w_hh, const Tensor& hin,
    const Tensor& rz, const Tensor& nn, const Tensor& ghn) {
  const char* op = "recurrl::gru_scan_backward";
  read_mm_setting();
  TORCH_CHECK(hin.dim() == 3, op, ": expected hin [T, N, H], received ", hin.sizes());
  const int64_t hid = hin.size(2);
  TORCH_CHECK(rz.dim() == 3 && rz.size(2) == 2 * hid, op, ": expected rz [T, N, 2H], received ",
              rz.sizes());
  for (const Tensor* s : {&dh, &nn, &ghn}) check_state(op, "a state", *s, hin, hid);
  require_contiguous(op, {&dh, &reset, &w_hh, &hin, &rz, &nn, &ghn});
  const int64_t steps = hin.size(0), n = hin.size(1);
  Tensor dxp = at::empty({steps, n, 3 * hid}, hin.options());
  Tensor dgh = at::empty({steps, n, 3 * hid}, hin.options());
  Tensor dsh = at::empty_like(hin), dw = at::zeros_like(w_hh);
  AT_DISPATCH_FLOATING_TYPES(hin.scalar_type(), "gru_scan_backward", [&] {
    gru_backward_impl<scalar_t>(dh, reset, w_hh, hin, rz, nn, ghn, dxp, dsh, dw, dgh);
  });
  Tensor db = dgh.view({steps * n, 3 * hid}).sum(0);
  return {dxp, dsh, dw, db};
}

// ------------------------------------------------------------------------------ one step
// One step of a one-layer LSTM/GRU, the ``cpp`` backend's sequential step (the modules' acting
// step; recurrl/functional/recurrent/cpp_step.py): x [N, F], each state [N, H] or [N, 1, H],
// reset [N] or [N, 1] bool or None. A restarting row's incoming state is zero, selected (never
// multiplied), so a NaN or inf stored there never reaches the step. The projections go by BLAS
// into one scratch buffer (x W_ih^T on top of the bias, h W_hh^T), then the scan's row kernels
// above: the numbers of one step of the scan. Returns the output y [N, H] and the new states,
// each shaped as its input (y is a tensor of its own: the module stores the states as the next
// step's). Inference only: no autograd formula (the Python side falls back to torch's cells
// where autograd would record).
void check_step(const char* op, const Tensor& x, const std::optional<Tensor>& reset,
                const Tensor& w_ih, const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                const std::optional<Tensor>& b_hh, int64_t gates,
                std::initializer_list<const Tensor*> states) {
  TORCH_CHECK(x.device().is_cpu(), op, ": expected CPU tensors, received ", x.device(),
              ". Fix: move the module and its inputs to the CPU, or use torch's cells there.");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": expected float32 or float64, received ", x.scalar_type(),
              ". Fix: convert the module and its inputs (module.float()).");
  TORCH_CHECK(x.dim() == 2, op, ": expected x [N, F], received ", x.sizes());
  const int64_t n = x.size(0), hid = w_hh.dim() == 2 ? w_hh.size(1) : -1;
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(0) == gates * hid, op, ": expected w_hh [", gates,
              "*H, H], received ", w_hh.sizes());
  TORCH_CHECK(w_ih.dim() == 2 && w_ih.size(0) == gates * hid && w_ih.size(1) == x.size(1), op,
              ": expected w_ih [", gates * hid, ", ", x.size(1), "], received ", w_ih.sizes());
  for (const Tensor* w : {&w_ih, &w_hh}) {
    TORCH_CHECK(w->scalar_type() == x.scalar_type() && w->device().is_cpu(), op,
                ": expected the weights on the CPU in x's dtype ", x.scalar_type(),
                ", received ", w->scalar_type(), " on ", w->device());
  }
  for (const auto* b : {&b_ih, &b_hh}) {
    if (!b->has_value() || !(*b)->defined()) continue;
    TORCH_CHECK((*b)->dim() == 1 && (*b)->size(0) == gates * hid &&
                    (*b)->scalar_type() == x.scalar_type() && (*b)->device().is_cpu(),
                op, ": expected a bias [", gates * hid, "] of ", x.scalar_type(), ", received ",
                (*b)->sizes(), " of ", (*b)->scalar_type());
  }
  for (const Tensor* s : states) {
    const bool shaped = (s->dim() == 2 && s->size(0) == n && s->size(1) == hid) ||
                        (s->dim() == 3 && s->size(0) == n && s->size(1) == 1 && s->size(2) == hid);
    TORCH_CHECK(shaped && s->scalar_type() == x.scalar_type() && s->device().is_cpu(), op,
                ": expected states [", n, ", ", hid, "] or [", n, ", 1, ", hid, "] of ",
                x.scalar_type(), ", received ", s->sizes(), " of ", s->scalar_type());
  }
  if (reset.has_value() && reset->defined()) {
    const Tensor& r = *reset;
    TORCH_CHECK(r.scalar_type() == at::kBool && r.numel() == n && r.device().is_cpu() &&
                    (r.dim() == 1 || (r.dim() == 2 && r.size(1) == 1)),
                op, ": expected reset [", n, "] or [", n, ", 1] bool, received ", r.sizes(),
                " of ", r.scalar_type());
  }
}

// The reset rows' flags (nullptr: no reset), the mask made contiguous in ``keep``.
const bool* reset_flags(const std::optional<Tensor>& reset, Tensor& keep) {
  if (!reset.has_value() || !reset->defined()) return nullptr;
  keep = reset->contiguous();
  return keep.const_data_ptr<bool>();
}

// hin = reset ? 0 : h, row by row (a select: NaN in a reset row is not read).
template <typename T>
void select_rows(const T* h, const bool* reset, int64_t n, int64_t hid, T* hin) {
  for (int64_t row = 0; row < n; ++row) {
    if (reset != nullptr && reset[row]) {
      std::memset(hin + row * hid, 0, hid * sizeof(T));
    } else {
      std::memcpy(hin + row * hid, h + row * hid, hid * sizeof(T));
    }
  }
}

// gx = x W_ih^T + bias (bias: nullptr for none), gh = hin W_hh^T; both [N, G*H].
template <typename T>
void step_projections(int64_t n, int64_t f, int64_t hid, int64_t gates, const T* x,
                      const T* hin, const T* w_ih, const T* w_hh, const T* bias, T* gx, T* gh) {
  const int64_t width = gates * hid;
  T beta = T(0);
  if (bias != nullptr) {
    for (int64_t row = 0; row < n; ++row) std::memcpy(gx + row * width, bias, width * sizeof(T));
    beta = T(1);
  } else if (f == 0) {
    std::memset(gx, 0, n * width * sizeof(T));
  }
  mm<T>(false, true, n, width, f, x, f, w_ih, f, beta, gx, width);
  mm<T>(false, true, n, width, hid, hin, hid, w_hh, hid, T(0), gh, width);
}

std::tuple<Tensor, Tensor, Tensor> lstm_step(const Tensor& x_, const Tensor& h_,
                                             const Tensor& c_,
                                             const std::optional<Tensor>& reset,
                                             const Tensor& w_ih_, const Tensor& w_hh_,
                                             const std::optional<Tensor>& b_ih,
                                             const std::optional<Tensor>& b_hh) {
  const char* op = "recurrl::lstm_step";
  read_mm_setting();
  check_step(op, x_, reset, w_ih_, w_hh_, b_ih, b_hh, 4, {&h_, &c_});
  const Tensor x = x_.contiguous(), h = h_.contiguous(), c = c_.contiguous();
  const Tensor w_ih = w_ih_.contiguous(), w_hh = w_hh_.contiguous();
  const int64_t n = x.size(0), f = x.size(1), hid = w_hh.size(1), g4 = 4 * hid;
  Tensor keep;
  const bool* flags = reset_flags(reset, keep);
  // the LSTM only ever uses the sum of its two biases (as LSTMKind.project)
  Tensor bias;
  if (b_ih.has_value() && b_ih->defined() && b_hh.has_value() && b_hh->defined()) {
    bias = at::add(*b_ih, *b_hh);
  } else if (b_ih.has_value() && b_ih->defined()) {
    bias = b_ih->contiguous();
  } else if (b_hh.has_value() && b_hh->defined()) {
    bias = b_hh->contiguous();
  }
  // scratch: gx, gh [N, 4H]; hin, tc [N, H]; a zero state row [H]
  Tensor scratch = at::empty({2 * n * g4 + 2 * n * hid + hid}, x.options());
  Tensor y = at::empty({n, hid}, x.options());
  Tensor h1 = at::empty(h.sizes(), x.options()), c1 = at::empty(c.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lstm_step", [&] {
    using T = scalar_t;
    T* gx = scratch.mutable_data_ptr<T>();
    T *gh = gx + n * g4, *hin = gh + n * g4, *tc = hin + n * hid, *zero = tc + n * hid;
    std::memset(zero, 0, hid * sizeof(T));
    select_rows(h.const_data_ptr<T>(), flags, n, hid, hin);
    step_projections<T>(n, f, hid, 4, x.const_data_ptr<T>(), hin, w_ih.const_data_ptr<T>(),
                        w_hh.const_data_ptr<T>(),
                        bias.defined() ? bias.const_data_ptr<T>() : nullptr, gx, gh);
    const T* cp = c.const_data_ptr<T>();
    T *yp = y.mutable_data_ptr<T>(), *hp = h1.mutable_data_ptr<T>();
    T* cq = c1.mutable_data_ptr<T>();
    for_rows(n, 5 * hid, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o4 = row * g4, o1 = row * hid;
        const T* c_in = flags != nullptr && flags[row] ? zero : cp + o1;
        lstm_fwd_row_f(hid, gx + o4, gh + o4, c_in, hp + o1, cq + o1, tc + o1);
        std::memcpy(yp + o1, hp + o1, hid * sizeof(T));
      }
    });
  });
  return {y, h1, c1};
}

std::tuple<Tensor, Tensor> gru_step(const Tensor& x_, const Tensor& h_,
                                    const std::optional<Tensor>& reset, const Tensor& w_ih_,
                                    const Tensor& w_hh_, const std::optional<Tensor>& b_ih,
                                    const std::optional<Tensor>& b_hh) {
  const char* op = "recurrl::gru_step";
  read_mm_setting();
  check_step(op, x_, reset, w_ih_, w_hh_, b_ih, b_hh, 3, {&h_});
  const Tensor x = x_.contiguous(), h = h_.contiguous();
  const Tensor w_ih = w_ih_.contiguous(), w_hh = w_hh_.contiguous();
  const int64_t n = x.size(0), f = x.size(1), hid = w_hh.size(1), g3 = 3 * hid;
  Tensor keep;
  const bool* flags = reset_flags(reset, keep);
  const Tensor b_in = b_ih.has_value() && b_ih->defined() ? b_ih->contiguous() : Tensor();
  const Tensor b_rec = b_hh.has_value() && b_hh->defined() ? b_hh->contiguous() : Tensor();
  // scratch: gx, gh [N, 3H]; hin, nn, ghn [N, H]; rz [N, 2H]; a zero b_hh [3H]
  Tensor scratch = at::empty({2 * n * g3 + 5 * n * hid + g3}, x.options());
  Tensor y = at::empty({n, hid}, x.options()), h1 = at::empty(h.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gru_step", [&] {
    using T = scalar_t;
    T* gx = scratch.mutable_data_ptr<T>();
    T *gh = gx + n * g3, *hin = gh + n * g3, *nn = hin + n * hid, *ghn = nn + n * hid;
    T *rz = ghn + n * hid, *zero = rz + 2 * n * hid;
    const T* b = b_rec.defined() ? b_rec.const_data_ptr<T>() : zero;
    if (!b_rec.defined()) std::memset(zero, 0, g3 * sizeof(T));
    select_rows(h.const_data_ptr<T>(), flags, n, hid, hin);
    step_projections<T>(n, f, hid, 3, x.const_data_ptr<T>(), hin, w_ih.const_data_ptr<T>(),
                        w_hh.const_data_ptr<T>(),
                        b_in.defined() ? b_in.const_data_ptr<T>() : nullptr, gx, gh);
    T *yp = y.mutable_data_ptr<T>(), *hp = h1.mutable_data_ptr<T>();
    for_rows(n, 4 * hid, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o3 = row * g3, o1 = row * hid;
        gru_fwd_row_f(hid, gx + o3, gh + o3, b, hin + o1, rz + 2 * o1, nn + o1, ghn + o1,
                      hp + o1);
        std::memcpy(yp + o1, hp + o1, hid * sizeof(T));
      }
    });
  });
  return {y, h1};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(recurrl, m) {
  m.def(
      "lstm_scan_forward(Tensor xp, Tensor sh, Tensor sc, Tensor reset, Tensor w_hh) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "lstm_scan_backward(Tensor dh, Tensor dc, Tensor reset, Tensor w_hh, Tensor gates, "
      "Tensor tc, Tensor hin, Tensor cin) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "gru_scan_forward(Tensor xp, Tensor sh, Tensor reset, Tensor w_hh, Tensor? b_hh) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "gru_scan_backward(Tensor dh, Tensor reset, Tensor w_hh, Tensor hin, Tensor rz, "
      "Tensor nn, Tensor ghn) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "lstm_step(Tensor x, Tensor h, Tensor c, Tensor? reset, Tensor w_ih, Tensor w_hh, "
      "Tensor? b_ih=None, Tensor? b_hh=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "gru_step(Tensor x, Tensor h, Tensor? reset, Tensor w_ih, Tensor w_hh, "
      "Tensor? b_ih=None, Tensor? b_hh=None) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(recurrl, CPU, m) {
  m.impl("lstm_scan_forward", &lstm_scan_forward);
  m.impl("lstm_scan_backward", &lstm_scan_backward);
  m.impl("gru_scan_forward", &gru_scan_forward);
  m.impl("gru_scan_backward", &gru_scan_backward);
  m.impl("lstm_step", &lstm_step);
  m.impl("gru_step", &gru_step);
}
