// Paged attention (decode, split-K decode, and causal prefill; fp32, bf16 and fp16 storage) vs a
// double-precision reference, on every ISA variant the CPU runs: the one kernel source
// (paged_attention_impl.h) instantiated for each vector backend.
#include <algorithm>
#include <numeric>
#include <vector>

#include "check.h"
#include "convert.h"
#include "paged_attention.h"
#include "thread_pool.h"

using namespace engine_cpu;

namespace {

uint16_t to_h(float v, DType dt) { return dt == DType::BF16 ? f32_to_bf16(v) : f32_to_fp16(v); }
float from_h(uint16_t v, DType dt) { return dt == DType::BF16 ? bf16_to_f32(v) : fp16_to_f32(v); }
float rounded(float v, DType dt) { return dt == DType::F32 ? v : from_h(to_h(v, dt), dt); }

void run(const std::vector<int>& lens, const std::vector<int>& q_lens, int hq, int hk, int D, int block, DType dt,
         std::mt19937& rng, const char* isa) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int B = static_cast<int>(lens.size());
  const bool prefill = !q_lens.empty();
  int max_blocks = 0, num_blocks = 0;
  for (int l : lens) max_blocks = std::max(max_blocks, (l + block - 1) / block);
  std::vector<int32_t> table(size_t(B) * max_blocks);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < max_blocks; ++j) table[b * max_blocks + j] = num_blocks++;
  std::shuffle(table.begin(), table.end(), rng);  // scattered blocks
  const size_t cache = size_t(num_blocks) * block * hk * D;
  std::vector<float> k(cache), v(cache);
  for (auto& x : k) x = rounded(n(rng), dt);
  for (auto& x : v) x = rounded(n(rng), dt);
  std::vector<int32_t> cu(B + 1, 0);
  for (int b = 0; b < B; ++b) cu[b + 1] = cu[b] + (prefill ? q_lens[b] : 1);
  const int T = cu[B];
  std::vector<float> q(size_t(T) * hq * D);
  for (auto& x : q) x = rounded(n(rng), dt);
  std::vector<uint16_t> kb(cache), vb(cache), qb(q.size()), ob(q.size());
  for (size_t i = 0; i < cache; ++i) kb[i] = to_h(k[i], dt), vb[i] = to_h(v[i], dt);
  for (size_t i = 0; i < q.size(); ++i) qb[i] = to_h(q[i], dt);
  const bool h16 = dt != DType::F32;
  std::vector<float> out(q.size(), 0.0f);
  std::vector<int32_t> seq(lens.begin(), lens.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  PagedAttnArgs a{};
  a.q = h16 ? static_cast<const void*>(qb.data()) : q.data();
  a.k_cache = h16 ? static_cast<const void*>(kb.data()) : k.data();
  a.v_cache = h16 ? static_cast<const void*>(vb.data()) : v.data();
  a.block_tables = table.data();
  a.bt_rows = B, a.max_blocks = max_blocks, a.bt_stride0 = max_blocks, a.bt_stride1 = 1;
  a.seq_lens = seq.data(), a.num_seqs = B;
  a.cu_seqlens_q = prefill ? cu.data() : nullptr, a.cu_len = B + 1;
  a.out = h16 ? static_cast<void*>(ob.data()) : out.data();
  a.num_tokens = T, a.hq = hq, a.hk = hk, a.head_dim = D;
  a.num_blocks = a.v_num_blocks = num_blocks, a.block_size = block;
  a.scale = scale, a.dtype = dt;
  paged_attention(a);
  if (h16)
    for (size_t i = 0; i < out.size(); ++i) out[i] = from_h(ob[i], dt);
  const double tol = dt == DType::BF16 ? 1e-2 : dt == DType::F16 ? 2e-3 : 2e-5;
  for (int b = 0; b < B; ++b)
    for (int i = cu[b]; i < cu[b + 1]; ++i) {
      const int pos = lens[b] - (cu[b + 1] - i);  // this query's position; it sees keys <= pos
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / (hq / hk);
        std::vector<double> s(pos + 1), o(D, 0.0);
        for (int t = 0; t <= pos; ++t) {
          const size_t row = (size_t(table[b * max_blocks + t / block]) * block + t % block) * hk * D + size_t(kvh) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[(size_t(i) * hq + h) * D + d]) * k[row + d];
          s[t] = dot * scale;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int t = 0; t <= pos; ++t) {
          const size_t row = (size_t(table[b * max_blocks + t / block]) * block + t % block) * hk * D + size_t(kvh) * D;
          for (int d = 0; d < D; ++d) o[d] += s[t] / sum * v[row + d];
        }
        for (int d = 0; d < D; ++d)
          if (!check::close(out[(size_t(i) * hq + h) * D + d], o[d], tol, tol)) {
            const char* dn = dt == DType::BF16 ? " bf16" : dt == DType::F16 ? " fp16" : " fp32";
            check::fail(std::string(isa) + dn + (prefill ? " prefill" : " decode") +
                        " D " + std::to_string(D) + " seq " + std::to_string(b) + " row " + std::to_string(i) +
                        " head " + std::to_string(h) + " d " + std::to_string(d) + ": got " +
                        std::to_string(out[(size_t(i) * hq + h) * D + d]) + ", want " + std::to_string(o[d]));
            return;
          }
      }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      set_num_threads(1);  // one thread where threads change nothing: idle workers spin, slow under qemu
      for (int D : {16, 64, 80, 128}) run({1, 17, 45}, {}, 9, 3, D, 16, dt, rng, isa);  // decode, odd lengths
      set_num_threads(2);
      run({300}, {}, 4, 1, 64, 16, dt, rng, isa);  // one pair: split into key partitions and merged
      run({5, 40}, {5, 13}, 8, 2, 32, 8, dt, rng, isa);  // prefill (one sequence with a cached prefix)
      run({23}, {23}, 6, 6, 256, 16, dt, rng, isa);  // largest head_dim, no GQA
    }
  });
}
