// The ``cpp`` backend's matmul (torch's BLAS, else at::mm_out) and how its scan kernels' rows
// split over torch's threads. Included by rnn.cpp alone (an unnamed namespace: internal).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>

// ------------------------------------------------------------------------------ matmul
// torch's own BLAS (MKL in the official wheels) when it exports the Fortran symbols, resolved
// at load time; else at::mm_out/addmm_ on views of the same memory.
#if defined(__linux__) && defined(__GNUC__)
#define RECURRL_WEAK_BLAS 1
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*) __attribute__((weak));
}
#endif

namespace {

using at::Tensor;

// RECURRL_EXT_TORCH_MM=1 (read at each op call) takes the at::mm_out path even where BLAS is
// found: for tests of that path.
thread_local bool g_torch_mm = false;

void read_mm_setting() {
  const char* value = std::getenv("RECURRL_EXT_TORCH_MM");
  g_torch_mm = value != nullptr && value[0] == '1';
}

template <typename T>
inline bool blas_gemm(char ta, char tb, int m, int n, int k, T alpha, const T* a, int lda,
                      const T* b, int ldb, T beta, T* c, int ldc) {
#ifdef RECURRL_WEAK_BLAS
  if (g_torch_mm) return false;
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_ == nullptr) return false;
    sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
  } else {
    if (dgemm_ == nullptr) return false;
    dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
  }
  return true;
#else
  return false;  // elsewhere a weak reference may not link: at::mm_out below
#endif
}

template <typename T>
Tensor view_of(const T* p, int64_t rows, int64_t cols, int64_t ld, bool trans) {
  auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  Tensor t = at::from_blob(const_cast<T*>(p), {trans ? cols : rows, trans ? rows : cols},
                           {ld, 1}, options);
  return trans ? t.t() : t;
}

// Row-major C[m, n] = beta * C + op(A)[m, k] @ op(B)[k, n] (beta 0 or 1), where op
// transposes a row-major operand stored with leading dimension lda/ldb.
template <typename T>
void mm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
        const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m < kMax && n < kMax && k < kMax && lda < kMax && ldb < kMax && ldc < kMax && k > 0) {
    // column-major: C^T = op(B)^T op(A)^T
    if (blas_gemm<T>(trans_b ? 'T' : 'N', trans_a ? 'T' : 'N', static_cast<int>(n),
                     static_cast<int>(m), static_cast<int>(k), T(1), b, static_cast<int>(ldb),
                     a, static_cast<int>(lda), beta, c, static_cast<int>(ldc))) {
      return;
    }
  }
  Tensor ct = view_of<T>(c, m, n, ldc, false);
  Tensor at_ = view_of<T>(a, m, k, lda, trans_a);
  Tensor bt = view_of<T>(b, k, n, ldb, trans_b);
  if (beta == T(0)) {
    at::mm_out(ct, at_, bt);
  } else {
    ct.addmm_(at_, bt);
  }
}

// Rows of one step's pointwise loop, in chunks of at least ~4096 elements per thread.
template <typename F>
void for_rows(int64_t n, int64_t width, const F& body) {
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(width, 1));
  if (n <= grain) {
    body(0, n);
  } else {
    at::parallel_for(0, n, grain, body);
  }
}

// A scan's rows are independent through all its steps: with torch on several threads, blocks
// of rows run each through every step (a GEMM of its own rows per step) in ONE parallel region
// per call, not one per step. One thread: one block (a GEMM over all rows). Blocks are whole
// multiples of 16 rows and n of 8 (where BLAS's panels split; a 1-row GEMM is a GEMV with
// other sums), so each row's numbers stay those of one thread (test_cpp.py checks it).
template <typename F>
void for_row_blocks(int64_t n, const F& body) {
  const int64_t threads = at::in_parallel_region() || n % 8 ? 1 : at::get_num_threads();
  const int64_t block = threads > 1 ? ((n + threads - 1) / threads + 15) / 16 * 16 : n;
  if (block >= n) return body(0, n);
  const bool torch_mm = g_torch_mm;  // the caller's setting, for every thread
  at::parallel_for(0, (n + block - 1) / block, 1, [&](int64_t b0, int64_t b1) {
    g_torch_mm = torch_mm;
    for (int64_t b = b0; b < b1; ++b) body(b * block, std::min(n, (b + 1) * block));
  });
}

}  // namespace
