// Issue 23's floor question: how fast is cuBLAS's own fp32 SIMT design when built from the open
// CUTLASS source with the public compiler? cuBLAS (torch.mm, TF32 off) runs, at w4096 M = 72-128
// and 200-256, cutlass_80_simt_sgemm_256x128_8x4_nn_align1 with a split-K of 8 / 4 and
// cublasLt::splitKreduce_kernel (benchmarks/probes/cutlass/cublas_kernels.py). This program times, in one
// process and one stream, cublasSgemm and CUTLASS 2.x GemmSplitKParallel kernels of the same
// tile, warp tile, stages and alignment, on the same arrays, as cuBLAS sees torch.mm(x, W) with
// x (M x K) and W (K x N) row-major: C (N x M) = A (N x K) * B (K x M), all column-major ("nn").
//
// Build (CPU; needs nvcc, a CUTLASS checkout and cuBLAS headers + libcublas.so.13):
//   benchmarks/probes/cutlass/build.sh CUTLASS_DIR CUBLAS_DIR OUT_BINARY [extra nvcc flags]
// Run (GPU; libcublas.so.13 on LD_LIBRARY_PATH, e.g. PyTorch's):  OUT_BINARY [M ...]
// Output: one "FACT <name> M=.. K=.. N=.. slices=.. us=<median> min=.. max=.. relerr=.." line per
// run (7 rounds of 50 back-to-back launches timed by events, after 20 warm-up launches; relerr
// is the worst of 64 sampled outputs against a float64 host sum, over the sum of |terms|);
// "FAIL ..." where a kernel cannot be set up or a sampled output is off by more than 1e-5. Every configuration runs twice, rounds interleaved
// with cuBLAS's, so drift shows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include <cublas_v2.h>
#include <cutlass/gemm/device/gemm_splitk_parallel.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    printf("FAIL CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

using Col = cutlass::layout::ColumnMajor;

// CUTLASS's SIMT split-K-parallel GEMM: tile TBM x TBN x 8, warp tile WM x WN x 8, ST stages,
// alignment 1 for A and B (cuBLAS's "align1").
template <int TBM, int TBN, int WM, int WN, int ST>
using SplitK = cutlass::gemm::device::GemmSplitKParallel<float, Col, float, Col, float, Col, float,
    cutlass::arch::OpClassSimt, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<TBM, TBN, 8>, cutlass::gemm::GemmShape<WM, WN, 8>, cutlass::gemm::GemmShape<1, 1, 1>,
    cutlass::epilogue::thread::LinearCombination<float, 1, float, float>,
    cutlass::epilogue::thread::Convert<float, 1, float>,
    cutlass::reduction::thread::ReduceAdd<float, float, 1>,
    cutlass::gemm::threadblock::GemmSplitKHorizontalThreadblockSwizzle, ST, 1, 1>;

static cublasHandle_t handle;
static float *dA, *dB, *dC;
static std::vector<float> hA, hB;

// cublasSgemm behind the same interface as a CUTLASS device operator.
struct Cublas {
  struct Arguments {
    int n, m, k;
    explicit Arguments(cutlass::gemm::GemmCoord p) : n(p.m()), m(p.n()), k(p.k()) {}
  };
  Arguments a{cutlass::gemm::GemmCoord(1, 1, 1)};
  static size_t get_workspace_size(Arguments const &) { return 0; }
  cutlass::Status initialize(Arguments const &x, void *) { a = x; return cutlass::Status::kSuccess; }
  cutlass::Status operator()() {
    const float one = 1.f, zero = 0.f;
    return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, a.n, a.m, a.k, &one, dA, a.n, dB, a.k, &zero, dC, a.n)
        == CUBLAS_STATUS_SUCCESS ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
  }
};

template <class G>
void run(const char *name, int n, int k, int m, int slices) {
  cutlass::gemm::GemmCoord p(n, m, k);
  typename G::Arguments args = [&] {
    if constexpr (std::is_same_v<G, Cublas>) return typename G::Arguments(p);
    else return typename G::Arguments(p, {dA, n}, {dB, k}, {dC, n}, {dC, n}, {1.0f, 0.0f}, slices);
  }();
  G g;
  size_t ws = G::get_workspace_size(args);
  void *w = nullptr;
  if (ws) CK(cudaMalloc(&w, ws));
  if (g.initialize(args, w) != cutlass::Status::kSuccess) {
    printf("FAIL initialize %s slices=%d\n", name, slices);
    if (w) CK(cudaFree(w));
    return;
  }
  CK(cudaMemset(dC, 0xff, sizeof(float) * n * m));  // NaN: an output never written shows
  if (g() != cutlass::Status::kSuccess) {
    printf("FAIL launch %s slices=%d\n", name, slices);
    if (w) CK(cudaFree(w));
    return;
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> hC((size_t)n * m);
  CK(cudaMemcpy(hC.data(), dC, sizeof(float) * hC.size(), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (unsigned s = 0; s < 64; ++s) {
    int i = (int)((s * 2654435761u) % (unsigned)n), j = (int)((s * 40503u) % (unsigned)m);
    double acc = 0, mag = 0;
    for (int q = 0; q < k; ++q) {
      double t = (double)hA[(size_t)q * n + i] * hB[(size_t)j * k + q];
      acc += t; mag += std::fabs(t);
    }
    double got = hC[(size_t)j * n + i];
    worst = std::isnan(got) ? INFINITY : std::max(worst, std::fabs(got - acc) / mag);
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 20; ++i) g();
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 50; ++i) g();
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000 / 50);
  }
  std::sort(t.begin(), t.end());
  if (!(worst <= 1e-5))  // fp32 sums of 4096 terms stay near 1e-7 of the sum of |terms|
    printf("FAIL check %s M=%d slices=%d relerr=%.1e\n", name, m, slices, worst);
  printf("FACT %s M=%d K=%d N=%d slices=%d us=%.2f min=%.2f max=%.2f relerr=%.1e\n", name, m, k, n, slices,
         t[3], t[0], t[6], worst);
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  if (w) CK(cudaFree(w));
}

int main(int argc, char **argv) {
  const int K = 4096, N = 4096;
  std::vector<int> rows;
  for (int i = 1; i < argc; ++i) rows.push_back(atoi(argv[i]));
  if (rows.empty()) rows = {64, 104, 128, 144, 192, 200, 256};
  int mmax = *std::max_element(rows.begin(), rows.end());
  hA.resize((size_t)N * K); hB.resize((size_t)K * mmax);
  srand(1234);
  for (auto &v : hA) v = rand() / (float)RAND_MAX - 0.5f;
  for (auto &v : hB) v = rand() / (float)RAND_MAX - 0.5f;
  CK(cudaMalloc(&dA, sizeof(float) * hA.size())); CK(cudaMalloc(&dB, sizeof(float) * hB.size()));
  CK(cudaMalloc(&dC, sizeof(float) * N * mmax));
  CK(cudaMemcpy(dA, hA.data(), sizeof(float) * hA.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dB, hB.data(), sizeof(float) * hB.size(), cudaMemcpyHostToDevice));
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) { printf("FAIL cublasCreate\n"); return 1; }
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);  // no TF32, as torch with allow_tf32 off
  for (int rep = 0; rep < 2; ++rep)
    for (int m : rows) {
      run<Cublas>("cublas", N, K, m, 1);
      for (int s : {2, 4, 8}) run<SplitK<256, 128, 64, 64, 4>>("cutlass_simt_256x128_8x4", N, K, m, s);
      for (int s : {4, 8}) run<SplitK<128, 128, 32, 64, 4>>("cutlass_simt_128x128_8x4", N, K, m, s);
      run<SplitK<128, 64, 64, 32, 4>>("cutlass_simt_128x64_8x4", N, K, m, 4);
    }
  return 0;
}
