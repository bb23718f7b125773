// rotary_embedding and silu_and_mul (fp32, bf16 and fp16 storage) on every ISA variant the CPU runs:
// the one kernel source of each (rotary_impl.h, activation_impl.h) per vector backend. Rotary must
// match a float reference bit for bit (no FMA, one rounding to the storage dtype); silu_and_mul a
// double-precision one within the vector exp's error.
#include <vector>

#include "activation.h"
#include "check.h"
#include "convert.h"
#include "rotary.h"

using namespace engine_cpu;

namespace {

float to_f(uint16_t v, DType dt) { return dt == DType::BF16 ? bf16_to_f32(v) : fp16_to_f32(v); }
uint16_t from_f(float v, DType dt) { return dt == DType::BF16 ? f32_to_bf16(v) : f32_to_fp16(v); }
float rounded(float v, DType dt) { return dt == DType::F32 ? v : to_f(from_f(v, dt), dt); }
const char* dname(DType dt) { return dt == DType::F32 ? "fp32" : dt == DType::BF16 ? "bf16" : "fp16"; }

// Storage of a float array in dtype dt (fp32: the floats themselves).
struct Buf {
  std::vector<float> f;
  std::vector<uint16_t> h;
  DType dt;
  Buf(const std::vector<float>& v, DType d) : f(v), h(v.size()), dt(d) {
    for (size_t i = 0; i < v.size(); ++i) h[i] = from_f(v[i], d);
  }
  void* ptr() { return dt == DType::F32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  float at(size_t i) const { return dt == DType::F32 ? f[i] : to_f(h[i], dt); }
};

std::vector<float> randn(size_t n, DType dt, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = rounded(nd(rng), dt);
  return v;
}

void rotary(int tokens, int hq, int hk, int hd, int rot, bool neox, DType dt, std::mt19937& rng, const char* isa) {
  const int max_pos = 50;
  std::vector<int64_t> pos(tokens);
  for (auto& p : pos) p = std::uniform_int_distribution<int>(0, max_pos - 1)(rng);
  const std::vector<float> cs = randn(size_t(max_pos) * rot, DType::F32, rng);
  const int q_stride = hq * hd + 5;  // token rows with a gap, as q sliced from a fused projection
  Buf q(randn(size_t(tokens) * q_stride, dt, rng, 2.0f), dt), k(randn(size_t(tokens) * hk * hd, dt, rng), dt);
  Buf qo(std::vector<float>(size_t(tokens) * hq * hd), dt), ko(std::vector<float>(size_t(tokens) * hk * hd), dt);
  rotary_embedding({pos.data(), tokens, q.ptr(), q_stride, tokens, hq, qo.ptr(), k.ptr(), hk * hd, tokens, hk,
                    ko.ptr(), cs.data(), max_pos, rot, hd, neox, dt});
  const int half = rot / 2;
  for (int which = 0; which < 2; ++which) {
    const Buf& in = which ? k : q;
    const Buf& out = which ? ko : qo;
    const int heads = which ? hk : hq, stride = which ? hk * hd : q_stride;
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < hd; ++c) {
          const size_t src = size_t(t) * stride + h * hd;
          float want;
          if (c >= rot) {
            want = in.at(src + c);
          } else {
            const int j = neox ? c % half : c / 2;
            const bool first = neox ? c < half : c % 2 == 0;
            const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
            const float a = in.at(src + ia), b = in.at(src + ib);
            const float co = cs[pos[t] * rot + j], si = cs[pos[t] * rot + half + j];
            const float ac = a * co, bs = b * si, bc = b * co, as = a * si;
            want = rounded(first ? ac - bs : bc + as, dt);
          }
          const float got = out.at(size_t(t) * heads * hd + h * hd + c);
          if (got != want) {
            check::fail(std::string(isa) + " rotary " + dname(dt) + (neox ? " neox" : " gptj") + " hd " +
                        std::to_string(hd) + " rot " + std::to_string(rot) + (which ? " k" : " q") + " t " +
                        std::to_string(t) + " h " + std::to_string(h) + " c " + std::to_string(c) + ": got " +
                        std::to_string(got) + ", want " + std::to_string(want));
            return;
          }
        }
  }
}

void silu(int rows, int d, DType dt, std::mt19937& rng, const char* isa) {
  const int x_stride = 2 * d + 3;
  std::vector<float> xv = randn(size_t(rows) * x_stride, dt, rng, 3.0f);
  xv[0] = rounded(-100.0f, dt);  // exp(-g) clamps; silu -> -0
  if (xv.size() > 2) xv[1] = rounded(90.0f, dt);
  Buf x(xv, dt), out(std::vector<float>(size_t(rows) * d), dt);
  silu_and_mul({x.ptr(), x_stride, out.ptr(), d, rows, d, dt});
  const double tol = dt == DType::F32 ? 1e-5 : dt == DType::BF16 ? 1e-2 : 2e-3;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < d; ++i) {
      const double g = x.at(size_t(r) * x_stride + i), u = x.at(size_t(r) * x_stride + d + i);
      const double want = g / (1.0 + std::exp(-g)) * u;
      const float got = out.at(size_t(r) * d + i);
      if (!check::close(got, want, tol * 1e-3, tol)) {
        check::fail(std::string(isa) + " silu_and_mul " + dname(dt) + " d " + std::to_string(d) + " at " +
                    std::to_string(r) + "," + std::to_string(i) + ": got " + std::to_string(got) + ", want " +
                    std::to_string(want));
        return;
      }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (bool neox : {true, false}) {
        for (int hd : {16, 64, 80, 128}) rotary(3, 3, 1, hd, hd, neox, dt, rng, isa);
        for (int rot : {2, 6, 24, 40}) rotary(2, 2, 1, 80, rot, neox, dt, rng, isa);  // partial rotary, odd tails
      }
      for (int d : {1, 3, 7, 16, 33, 100, 1001}) silu(3, d, dt, rng, isa);
    }
  });
}
