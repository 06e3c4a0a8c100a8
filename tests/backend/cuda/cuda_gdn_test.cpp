// The Gated DeltaNet prefill forms and the bf16 state slots of the CUDA backend against the CPU backend, at
// the 35B-A3B head shape (16 key heads, 32 value heads, 128 x 128). Outputs are poisoned with NaN first.
//
// The chunked form runs its products on bf16 tensor cores (operands rounded to bf16, 2^-9 relative, float32
// accumulation and a float32 state), so it is held to kChunked of the outputs' scale; the recurrent form and
// decode stay float32 (1e-4). A bf16 slot is compared with the CPU's widen-compute-round of the same values,
// so it may differ by one bf16 rounding step (2^-8 relative) where the float32 results straddle a boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "common/dtype.h"
#include "cuda_test_util.h"
#include "storage/state_cache.h"

namespace moeserve {
namespace {

using namespace testing;  // moeserve::testing: cuda_test_util.h

constexpr double kChunked = 1e-2;
constexpr double kRecurrent = 1e-4;
constexpr double kBf16Slot = 1e-2;  // one bf16 step of values below 1 in magnitude, plus kChunked paths

const DeltaRuleShape kShape{16, 32, 128, 128};
constexpr int64_t kKeyDim = 16 * 128, kC = 2 * kKeyDim + 32 * 128;
constexpr size_t kStateN = size_t(32) * 128 * 128;

// The prefill form the backend takes, for the lifetime of the object (MOESERVE_CUDA_GDN_CHUNKED_MIN).
class ChunkedFrom {
 public:
  explicit ChunkedFrom(int64_t tokens) {
    setenv("MOESERVE_CUDA_GDN_CHUNKED_MIN", std::to_string(tokens).c_str(), 1);
  }
  ~ChunkedFrom() { unsetenv("MOESERVE_CUDA_GDN_CHUNKED_MIN"); }
};

struct Inputs {
  std::vector<float> qkv, g, beta;
};
Inputs make_inputs(int64_t T, uint32_t seed) {
  Inputs in{random_vector(size_t(T * kC), seed), {}, {}};
  auto b = random_vector(size_t(T * 32), seed + 1), a = random_vector(size_t(T * 32), seed + 2);
  for (size_t i = 0; i < b.size(); ++i) {
    in.beta.push_back(float(testing::sigmoid(b[i])));
    in.g.push_back(-std::abs(a[i]) * 0.3f);
  }
  return in;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}
std::vector<float> widen(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_f32(x[i]);
  return out;
}
// A bf16 cache range's values, through float-sized transfers (the sizes here are even).
void upload_bf16(Backend& be, const std::vector<uint16_t>& host, uint16_t* dst) {
  be.upload(reinterpret_cast<const float*>(host.data()), reinterpret_cast<float*>(dst), host.size() / 2);
}
std::vector<uint16_t> download_bf16(Backend& be, const uint16_t* src, size_t n) {
  std::vector<uint16_t> host(n);
  be.download(reinterpret_cast<const float*>(src), reinterpret_cast<float*>(host.data()), n / 2);
  return host;
}

class CudaGdn : public ::testing::Test {
 protected:
  void SetUp() override {
    MOESERVE_REQUIRE_GPU();
    gpu = make_backend("cuda");
  }
  // Runs one prefill chunk on both backends; returns the output error.
  double prefill(const Inputs& in, int64_t T, std::vector<float>& cpu_state, float* gpu_state) {
    std::vector<float> ref(size_t(T * 32 * 128));
    const float* q = in.qkv.data();
    cpu->gated_delta_rule(kShape, q, q + kKeyDim, kC, q + 2 * kKeyDim, kC, in.g.data(), in.beta.data(), T,
                          cpu_state.data(), ref.data());
    auto qd = to_device(*gpu, in.qkv), gd = to_device(*gpu, in.g), bd = to_device(*gpu, in.beta);
    auto out = poisoned(*gpu, ref.size());
    gpu->gated_delta_rule(kShape, qd.get(), qd.get() + kKeyDim, kC, qd.get() + 2 * kKeyDim, kC, gd.get(),
                          bd.get(), T, gpu_state, out.get());
    return rel_error(to_host(*gpu, out.get(), ref.size()), ref);
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu;
};

// Lengths on, below and past chunk boundaries, each continuing the state the one before left (starting from
// a random, non-zero state); then recurrent steps from the chunked form's final state.
TEST_F(CudaGdn, ChunkedPrefillMatchesCpuAndContinuesTheState) {
  const ChunkedFrom always(1);
  auto cpu_state = random_vector(kStateN, 70, 0.1f);
  float* gpu_state = gpu->cache_memory()->allocate_cache(kStateN);
  gpu->upload(cpu_state.data(), gpu_state, kStateN);
  uint32_t seed = 71;
  for (int64_t T : {64, 1, 100, 128, 63, 65, 300}) {
    const double out_err = prefill(make_inputs(T, seed), T, cpu_state, gpu_state);
    seed += 3;
    const double state_err = rel_error(to_host(*gpu, gpu_state, kStateN), cpu_state);
    std::printf("chunked T=%lld: output error %.2e, state error %.2e\n", static_cast<long long>(T), out_err,
                state_err);
    EXPECT_LT(out_err, kChunked) << "T=" << T;
    EXPECT_LT(state_err, kChunked) << "state after T=" << T;
  }
  // Recurrent steps continue from the state the chunked form wrote: only the carried difference remains.
  const ChunkedFrom never(1 << 30);
  for (int64_t T : {1, 1, 7}) {
    EXPECT_LT(prefill(make_inputs(T, seed), T, cpu_state, gpu_state), kChunked) << "recurrent T=" << T;
    seed += 3;
  }
  gpu->cache_memory()->free_cache(gpu_state);
}

// Decode (gdn_decode) after a chunked prefill, against the CPU's decode from the CPU's prefill state.
TEST_F(CudaGdn, DecodeContinuesFromTheChunkedPrefillState) {
  const ChunkedFrom always(1);
  const int K = 4;
  const size_t conv_n = size_t(kC * (K - 1));
  auto conv_w = random_vector(size_t(kC * K), 80), a_log = random_vector(32, 81, 0.5f);
  auto dt_bias = random_vector(32, 82), norm_w = random_vector(128, 83, 0.1f);
  std::vector<float> cpu_state(kStateN, 0.0f), cpu_conv(conv_n, 0.0f);
  float* gpu_state = gpu->cache_memory()->allocate_cache(kStateN);
  float* gpu_conv = gpu->cache_memory()->allocate_cache(conv_n);
  prefill(make_inputs(200, 84), 200, cpu_state, gpu_state);
  uint32_t seed = 90;
  for (int step = 0; step < 4; ++step) {
    auto qkv = random_vector(size_t(kC), seed++), z = random_vector(32 * 128, seed++);
    auto b = random_vector(32, seed++), a = random_vector(32, seed++);
    std::vector<float> ref(32 * 128);
    float* cc[] = {cpu_conv.data()};
    float* cr[] = {cpu_state.data()};
    cpu->gdn_decode(kShape, qkv.data(), z.data(), b.data(), a.data(), 1, conv_w.data(), K, a_log.data(),
                    dt_bias.data(), norm_w.data(), 1e-6f, cc, cr, ref.data());
    auto qd = to_device(*gpu, qkv), zd = to_device(*gpu, z), bd = to_device(*gpu, b), ad = to_device(*gpu, a);
    auto out = poisoned(*gpu, ref.size());
    float* gc[] = {gpu_conv};
    float* gr[] = {gpu_state};
    gpu->gdn_decode(kShape, qd.get(), zd.get(), bd.get(), ad.get(), 1, conv_w.data(), K, a_log.data(),
                    dt_bias.data(), norm_w.data(), 1e-6f, gc, gr, out.get());
    // The normed output is scale-free (values near 1 over a head): the state's bf16-level difference shows
    // up at that level.
    EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), kChunked) << "decode step " << step;
    EXPECT_LT(rel_error(to_host(*gpu, gpu_state, kStateN), cpu_state), kChunked) << "state, step " << step;
  }
  gpu->cache_memory()->free_cache(gpu_state);
  gpu->cache_memory()->free_cache(gpu_conv);
}

// bf16 state slots: every GDN op reads the bf16 values into float32 and rounds its results back, which is
// what the CPU's widen / compute / round does; conv state too.
TEST_F(CudaGdn, Bf16StateSlotsMatchCpuRoundedState) {
  CacheMemory& mem = *gpu->cache_memory();
  for (int64_t chunked_from : {int64_t(1) << 30, int64_t(1)}) {  // recurrent, then chunked prefill
    const ChunkedFrom form(chunked_from);
    auto host = to_bf16(random_vector(kStateN, 100, 0.1f));
    std::vector<float> cpu_state = widen(host);
    uint16_t* slot = mem.allocate_cache_bf16(kStateN);
    upload_bf16(*gpu, host, slot);
    uint32_t seed = 101;
    for (int64_t T : {130, 1, 17}) {
      const double out_err = prefill(make_inputs(T, seed), T, cpu_state, reinterpret_cast<float*>(slot));
      seed += 3;
      cpu_state = widen(to_bf16(cpu_state));  // the CPU pool rounds after every step
      const auto got = widen(download_bf16(*gpu, slot, kStateN));
      // Recurrent: float32 math; a state value whose rounding went the other way moves the output slightly.
      EXPECT_LT(out_err, chunked_from == 1 ? kChunked : 10 * kRecurrent) << "T=" << T;
      EXPECT_LT(rel_error(got, cpu_state), kBf16Slot) << "bf16 state after T=" << T;
    }
    mem.free_cache(reinterpret_cast<float*>(slot));
  }

  // Decode and the conv state: 2 sequences (the register kernel) and 64 (the staged one), whose slots are in
  // one bf16 range.
  const int K = 4;
  const size_t conv_n = size_t(kC * (K - 1));
  auto conv_w = random_vector(size_t(kC * K), 110), a_log = random_vector(32, 111, 0.5f);
  auto dt_bias = random_vector(32, 112), norm_w = random_vector(128, 113, 0.1f);
  for (int64_t n : {2, 64}) {
    const size_t N = size_t(n);
    auto conv_host = to_bf16(random_vector(N * conv_n, 114, 0.5f));
    auto rec_host = to_bf16(random_vector(N * kStateN, 115, 0.1f));
    auto cpu_conv = widen(conv_host), cpu_rec = widen(rec_host);
    uint16_t* conv = mem.allocate_cache_bf16(N * conv_n);
    uint16_t* rec = mem.allocate_cache_bf16(N * kStateN);
    upload_bf16(*gpu, conv_host, conv);
    upload_bf16(*gpu, rec_host, rec);
    uint32_t seed = 120;
    for (int step = 0; step < 3; ++step) {
      auto qkv = random_vector(N * kC, seed++), z = random_vector(N * 32 * 128, seed++);
      auto b = random_vector(N * 32, seed++), a = random_vector(N * 32, seed++);
      std::vector<float> ref(N * 32 * 128);
      std::vector<float*> cc, cr, gc, gr;
      for (size_t i = 0; i < N; ++i) {
        cc.push_back(cpu_conv.data() + i * conv_n), cr.push_back(cpu_rec.data() + i * kStateN);
        gc.push_back(reinterpret_cast<float*>(conv + i * conv_n));
        gr.push_back(reinterpret_cast<float*>(rec + i * kStateN));
      }
      cpu->gdn_decode(kShape, qkv.data(), z.data(), b.data(), a.data(), n, conv_w.data(), K, a_log.data(),
                      dt_bias.data(), norm_w.data(), 1e-6f, cc, cr, ref.data());
      cpu_conv = widen(to_bf16(cpu_conv));
      cpu_rec = widen(to_bf16(cpu_rec));
      auto qd = to_device(*gpu, qkv), zd = to_device(*gpu, z), bd = to_device(*gpu, b),
           ad = to_device(*gpu, a);
      auto out = poisoned(*gpu, ref.size());
      gpu->gdn_decode(kShape, qd.get(), zd.get(), bd.get(), ad.get(), n, conv_w.data(), K, a_log.data(),
                      dt_bias.data(), norm_w.data(), 1e-6f, gc, gr, out.get());
      EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), kBf16Slot)
          << n << " sequences, decode step " << step;
      EXPECT_LT(rel_error(widen(download_bf16(*gpu, conv, N * conv_n)), cpu_conv), kBf16Slot) << "conv state";
      EXPECT_LT(rel_error(widen(download_bf16(*gpu, rec, N * kStateN)), cpu_rec), kBf16Slot) << "state";
    }
    mem.free_cache(reinterpret_cast<float*>(conv));
    mem.free_cache(reinterpret_cast<float*>(rec));
  }
}

// A speculative verify step (gdn_verify): three sequences of 4, 1 and 3 tokens at scattered rows, against the
// CPU's composition (gdn_decode token by token, the state copied after each token but the last). Float32
// slots hold the decode bound on the outputs, the live states and every trail state; bf16 slots are compared
// with the CPU's widen-compute-round per token (what a decode step stores and the next reads). Outputs and
// trail slots are poisoned with NaN first.
TEST_F(CudaGdn, VerifyStepKeepsEveryPositionsStateAsDecodeWould) {
  const int K = 4;
  const int64_t value_dim = 32 * 128;
  const size_t conv_n = size_t(kC * (K - 1));
  auto conv_w = random_vector(size_t(kC * K), 130), a_log = random_vector(32, 131, 0.5f);
  auto dt_bias = random_vector(32, 132), norm_w = random_vector(128, 133, 0.1f);
  const std::vector<int64_t> first_rows = {4, 0, 1}, lengths = {4, 1, 3};
  const int64_t rows = 8, n = 3, trails = 5;
  auto qkv = random_vector(size_t(rows * kC), 134), z = random_vector(size_t(rows * value_dim), 135);
  auto b = random_vector(size_t(rows * 32), 136), a = random_vector(size_t(rows * 32), 137);
  auto qd = to_device(*gpu, qkv), zd = to_device(*gpu, z), bd = to_device(*gpu, b), ad = to_device(*gpu, a);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 slots" : "float32 slots");
    const size_t per = bf16 ? 2 : 1;  // values per float-sized unit of a range
    // n live states, then the trails; conv states in one range, recurrent states in another.
    auto conv_host = random_vector(size_t(n) * conv_n, 138, 0.5f);
    auto rec_host = random_vector(size_t(n) * kStateN, 139, 0.1f);
    if (bf16) conv_host = widen(to_bf16(conv_host)), rec_host = widen(to_bf16(rec_host));
    CacheMemory& mem = *gpu->cache_memory();
    const size_t slots = size_t(n + trails);
    float* conv = bf16 ? reinterpret_cast<float*>(mem.allocate_cache_bf16(slots * conv_n))
                       : mem.allocate_cache(slots * conv_n);
    float* rec = bf16 ? reinterpret_cast<float*>(mem.allocate_cache_bf16(slots * kStateN))
                      : mem.allocate_cache(slots * kStateN);
    auto put = [&](const std::vector<float>& host, float* dst) {
      if (bf16)
        upload_bf16(*gpu, to_bf16(host), reinterpret_cast<uint16_t*>(dst));
      else
        gpu->upload(host.data(), dst, host.size());
    };
    auto get = [&](const float* src, size_t values) {
      return bf16 ? widen(download_bf16(*gpu, reinterpret_cast<const uint16_t*>(src), values))
                  : to_host(*gpu, src, values);
    };
    put(conv_host, conv);
    put(rec_host, rec);
    put(std::vector<float>(size_t(trails) * conv_n, NAN), conv + n * conv_n / per);
    put(std::vector<float>(size_t(trails) * kStateN, NAN), rec + n * kStateN / per);
    auto conv_at = [&](int64_t slot) { return conv + slot * int64_t(conv_n / per); };
    auto rec_at = [&](int64_t slot) { return rec + slot * int64_t(kStateN / per); };

    // The CPU: token after token, rounding the state through bf16 after each when the slots are bf16.
    std::vector<float> ref(size_t(rows * value_dim));
    std::vector<std::vector<float>> ref_conv_trails, ref_rec_trails;
    for (int64_t i = 0; i < n; ++i) {
      float* cc = conv_host.data() + i * conv_n;
      float* cr = rec_host.data() + i * kStateN;
      for (int64_t t = 0; t < lengths[size_t(i)]; ++t) {
        const int64_t r = first_rows[size_t(i)] + t;
        cpu->gdn_decode(kShape, qkv.data() + r * kC, z.data() + r * value_dim, b.data() + r * 32,
                        a.data() + r * 32, 1, conv_w.data(), K, a_log.data(), dt_bias.data(), norm_w.data(),
                        1e-6f, {&cc, 1}, {&cr, 1}, ref.data() + r * value_dim);
        if (bf16) {
          std::vector<float> c(cc, cc + conv_n), s(cr, cr + kStateN);
          c = widen(to_bf16(c)), s = widen(to_bf16(s));
          std::copy(c.begin(), c.end(), cc), std::copy(s.begin(), s.end(), cr);
        }
        if (t + 1 < lengths[size_t(i)])
          ref_conv_trails.emplace_back(cc, cc + conv_n), ref_rec_trails.emplace_back(cr, cr + kStateN);
      }
    }
    std::vector<float*> gc, gr, gct, grt;
    for (int64_t i = 0; i < n; ++i) gc.push_back(conv_at(i)), gr.push_back(rec_at(i));
    for (int64_t t = 0; t < trails; ++t) gct.push_back(conv_at(n + t)), grt.push_back(rec_at(n + t));
    auto out = poisoned(*gpu, ref.size());
    gpu->gdn_verify(kShape, qd.get(), zd.get(), bd.get(), ad.get(), first_rows, lengths, conv_w.data(), K,
                    a_log.data(), dt_bias.data(), norm_w.data(), 1e-6f, gc, gr, gct, grt, out.get());
    const double tol = bf16 ? kBf16Slot : kRecurrent;
    EXPECT_LT(rel_error(to_host(*gpu, out.get(), ref.size()), ref), tol) << "outputs";
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_LT(rel_error(get(gc[size_t(i)], conv_n),
                          {conv_host.begin() + i * conv_n, conv_host.begin() + (i + 1) * conv_n}),
                tol)
          << "conv state " << i;
      EXPECT_LT(rel_error(get(gr[size_t(i)], kStateN),
                          {rec_host.begin() + i * kStateN, rec_host.begin() + (i + 1) * kStateN}),
                tol)
          << "state " << i;
    }
    for (int64_t t = 0; t < trails; ++t) {
      EXPECT_LT(rel_error(get(gct[size_t(t)], conv_n), ref_conv_trails[size_t(t)]), tol)
          << "conv trail " << t;
      EXPECT_LT(rel_error(get(grt[size_t(t)], kStateN), ref_rec_trails[size_t(t)]), tol) << "trail " << t;
    }
    mem.free_cache(conv);
    mem.free_cache(rec);
  }
}

// Snapshots of bf16 slots in GPU memory: copy_slot moves the stored bytes, clear_slot zeroes them.
TEST_F(CudaGdn, Bf16StateCacheCopiesAndClearsSlotsInGpuMemory) {
  StateCacheSpec spec{.num_layers = 2,
                      .conv_dim = 10,
                      .conv_kernel = 4,
                      .num_v_heads = 2,
                      .k_head_dim = 4,
                      .v_head_dim = 6,
                      .num_slots = 3,
                      .memory = gpu->cache_memory(),
                      .dtype = DType::BF16};
  StateCache cache(spec);
  EXPECT_EQ(spec.bytes_per_slot(), 2 * (30 + 48) * 2);
  const auto conv = to_bf16(random_vector(30, 130)), rec = to_bf16(random_vector(48, 131));
  for (int layer = 0; layer < 2; ++layer) {
    upload_bf16(*gpu, conv, reinterpret_cast<uint16_t*>(cache.conv(layer, 1)));
    upload_bf16(*gpu, rec, reinterpret_cast<uint16_t*>(cache.recurrent(layer, 1)));
  }
  cache.copy_slot(1, 2);
  cache.clear_slot(1);
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(download_bf16(*gpu, reinterpret_cast<uint16_t*>(cache.conv(layer, 2)), 30), conv);
    EXPECT_EQ(download_bf16(*gpu, reinterpret_cast<uint16_t*>(cache.recurrent(layer, 2)), 48), rec);
    EXPECT_EQ(download_bf16(*gpu, reinterpret_cast<uint16_t*>(cache.recurrent(layer, 1)), 48),
              std::vector<uint16_t>(48, 0));
  }
}

}  // namespace
}  // namespace moeserve
