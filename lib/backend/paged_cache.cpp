// Host paged cache and the CPU twins of the CUDA decode kernels (see paged_cache.h).
#include "backend/paged_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "attention/partial_attention.h"
#include "common/error.h"
#include "common/float16.h"

namespace oscar {

int64_t HostPagedCache::int2_row(int b, int kv, int token) const {
  const int P = geometry.int2_page_size;
  const int32_t page = int2_page_table[static_cast<size_t>(b) * int2_max_pages + token / P];
  return (static_cast<int64_t>(page) * geometry.num_kv_heads + kv) * P + token % P;
}

int64_t HostPagedCache::bf16_row(int b, int kv, int token) const {
  const int P = geometry.bf16_page_size;
  const int32_t page = bf16_page_table[static_cast<size_t>(b) * bf16_max_pages + token / P];
  return (static_cast<int64_t>(page) * geometry.num_kv_heads + kv) * P + token % P;
}

int64_t HostPagedCache::int2_bytes_read() const {
  int64_t tokens = std::accumulate(int2_lengths.begin(), int2_lengths.end(), int64_t{0});
  return tokens * geometry.num_kv_heads * (2 * geometry.head_dim / 4 + geometry.int2_metadata_row_bytes());
}

std::vector<uint16_t> int2_metadata_fp16(const HostPagedCache& cache) {
  std::vector<uint16_t> half(cache.int2_metadata.size());
  for (size_t i = 0; i < half.size(); ++i) {
    const float x = cache.int2_metadata[i];
    half[i] = float_to_fp16(x);
    const float back = fp16_to_float(half[i]);
    OSCAR_CHECK(back == x || (std::isnan(x) && std::isnan(back)),
                "INT2 metadata row {} ({}) holds {:g}, which is not an fp16 value: quantise with fp16 metadata "
                "for the fp16 layout",
                i / 4, i % 4 < 2 ? (i % 2 ? "key zero" : "key scale") : (i % 2 ? "value zero" : "value scale"), x);
  }
  return half;
}

int64_t HostPagedCache::bf16_bytes_read() const {
  int64_t tokens = std::accumulate(bf16_lengths.begin(), bf16_lengths.end(), int64_t{0});
  return tokens * geometry.num_kv_heads * 2 * geometry.head_dim * 2;
}

static void build_table(int batch, const std::vector<int32_t>& lengths, int page_size, std::mt19937_64& rng,
                        int& max_pages, int& pages, std::vector<int32_t>& table) {
  max_pages = 1;
  pages = 0;
  for (int b = 0; b < batch; ++b) {
    const int need = (lengths[b] + page_size - 1) / page_size;
    max_pages = std::max(max_pages, need);
    pages += need;
  }
  std::vector<int32_t> order(std::max(pages, 1));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  table.assign(static_cast<size_t>(batch) * max_pages, -1);
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < (lengths[b] + page_size - 1) / page_size; ++i)
      table[static_cast<size_t>(b) * max_pages + i] = order[next++];
  pages = std::max(pages, 1);
}

HostPagedCache make_paged_cache(const PagedCacheGeometry& geometry, const std::vector<int32_t>& int2_lengths,
                                const std::vector<int32_t>& bf16_lengths, uint64_t seed) {
  const auto& g = geometry;
  OSCAR_CHECK(g.batch >= 1 && g.num_kv_heads >= 1 && g.group >= 1 && g.head_dim >= 4 && g.head_dim % 4 == 0,
              "paged cache: bad geometry (batch {}, kv heads {}, group {}, head_dim {})", g.batch, g.num_kv_heads,
              g.group, g.head_dim);
  OSCAR_CHECK(g.int2_page_size >= 16 && g.int2_page_size % 16 == 0, "INT2 page size {} is not a multiple of 16",
              g.int2_page_size);
  OSCAR_CHECK(g.bf16_page_size >= 32 && g.bf16_page_size % 32 == 0, "BF16 page size {} is not a multiple of 32",
              g.bf16_page_size);
  OSCAR_CHECK(!g.int2_metadata_fp16 || g.int2_page_size >= 32,
              "INT2 page size {}: the fp16 metadata layout needs pages of >= 32 tokens", g.int2_page_size);
  OSCAR_CHECK(static_cast<int>(int2_lengths.size()) == g.batch && static_cast<int>(bf16_lengths.size()) == g.batch,
              "paged cache: {} sequences but {} INT2 and {} BF16 lengths", g.batch, int2_lengths.size(),
              bf16_lengths.size());
  for (int b = 0; b < g.batch; ++b)
    OSCAR_CHECK(int2_lengths[b] >= 0 && bf16_lengths[b] >= 0, "paged cache: negative length for sequence {}", b);
  HostPagedCache cache;
  cache.geometry = g;
  cache.int2_lengths = int2_lengths;
  cache.bf16_lengths = bf16_lengths;
  std::mt19937_64 rng(seed);
  build_table(g.batch, int2_lengths, g.int2_page_size, rng, cache.int2_max_pages, cache.int2_pages,
              cache.int2_page_table);
  build_table(g.batch, bf16_lengths, g.bf16_page_size, rng, cache.bf16_max_pages, cache.bf16_pages,
              cache.bf16_page_table);
  const size_t int2_rows = static_cast<size_t>(cache.int2_pages) * g.num_kv_heads * g.int2_page_size;
  const size_t bf16_rows = static_cast<size_t>(cache.bf16_pages) * g.num_kv_heads * g.bf16_page_size;
  cache.key_codes.assign(int2_rows * g.head_dim / 4, 0);
  cache.value_codes.assign(int2_rows * g.head_dim / 4, 0);
  cache.int2_metadata.assign(int2_rows * 4, 0.0f);
  cache.bf16_keys.assign(bf16_rows * g.head_dim, 0);
  cache.bf16_values.assign(bf16_rows * g.head_dim, 0);
  return cache;
}

void quantize_pack_rows_reference(const float* input, long rows, int dim, const float* rotation,
                                  const QuantizerConfig& config, uint8_t* codes, float* metadata, int stride,
                                  int offset, const int64_t* destination_rows) {
  validate_quantizer(config, dim);
  OSCAR_CHECK(config.bits == 2 && config.resolved_group(dim) == dim,
              "the serving layout stores 2-bit codes with one (scale, zero) per row");
  std::vector<float> rotated(dim);
  std::vector<uint8_t> unpacked(dim);
  for (long r = 0; r < rows; ++r) {
    const float* x = input + static_cast<size_t>(r) * dim;
    if (rotation) {
      for (int c = 0; c < dim; ++c) {
        double acc = 0;
        for (int k = 0; k < dim; ++k) acc += static_cast<double>(x[k]) * rotation[static_cast<size_t>(k) * dim + c];
        rotated[c] = static_cast<float>(acc);
      }
      x = rotated.data();
    }
    const int64_t dst = destination_rows ? destination_rows[r] : r;
    float scale = 0, zero = 0;
    quantize_row(x, dim, config, unpacked.data(), &scale, &zero);
    pack_codes(unpacked.data(), dim, 2, codes + dst * (dim / 4));
    metadata[dst * stride + offset] = scale;
    metadata[dst * stride + offset + 1] = zero;
  }
}

void fill_bf16_tier(HostPagedCache& cache, int b, int kv, const float* keys, const float* values, int n) {
  const int d = cache.geometry.head_dim;
  OSCAR_CHECK(n == cache.bf16_lengths[b], "BF16 tier of sequence {} holds {} tokens, got {}", b,
              cache.bf16_lengths[b], n);
  for (int t = 0; t < n; ++t) {
    const int64_t row = cache.bf16_row(b, kv, t);
    for (int c = 0; c < d; ++c) {
      cache.bf16_keys[row * d + c] = float_to_bf16(keys[static_cast<size_t>(t) * d + c]);
      cache.bf16_values[row * d + c] = float_to_bf16(values[static_cast<size_t>(t) * d + c]);
    }
  }
}

void fill_int2_tier(HostPagedCache& cache, int b, int kv, const float* keys, const float* values, int n,
                    const QuantizerConfig& key_config, const QuantizerConfig& value_config) {
  const int d = cache.geometry.head_dim;
  OSCAR_CHECK(n == cache.int2_lengths[b], "INT2 tier of sequence {} holds {} tokens, got {}", b,
              cache.int2_lengths[b], n);
  std::vector<int64_t> dst(n);
  for (int t = 0; t < n; ++t) dst[t] = cache.int2_row(b, kv, t);
  quantize_pack_rows_reference(keys, n, d, nullptr, key_config, cache.key_codes.data(), cache.int2_metadata.data(),
                               4, 0, dst.data());
  quantize_pack_rows_reference(values, n, d, nullptr, value_config, cache.value_codes.data(),
                               cache.int2_metadata.data(), 4, 2, dst.data());
}

void paged_decode_reference(const HostPagedCache& cache, const float* queries, double softmax_scale,
                            const float* value_rotation, float* out) {
  const auto& g = cache.geometry;
  const int d = g.head_dim, Q = d / 4;
  std::vector<float> keys, values, bf16k, bf16v;
  std::vector<uint8_t> codes(d);
  for (int b = 0; b < g.batch; ++b) {
    for (int kv = 0; kv < g.num_kv_heads; ++kv) {
      const int n2 = cache.int2_lengths[b], n16 = cache.bf16_lengths[b];
      keys.assign(static_cast<size_t>(n2) * d, 0.f);
      values.assign(static_cast<size_t>(n2) * d, 0.f);
      for (int t = 0; t < n2; ++t) {
        const int64_t row = cache.int2_row(b, kv, t);
        const float* meta = &cache.int2_metadata[row * 4];
        unpack_codes(&cache.key_codes[row * Q], d, 2, codes.data());
        dequantize_row(codes.data(), meta + 0, meta + 1, d, d, &keys[static_cast<size_t>(t) * d]);
        unpack_codes(&cache.value_codes[row * Q], d, 2, codes.data());
        dequantize_row(codes.data(), meta + 2, meta + 3, d, d, &values[static_cast<size_t>(t) * d]);
      }
      bf16k.assign(static_cast<size_t>(n16) * d, 0.f);
      bf16v.assign(static_cast<size_t>(n16) * d, 0.f);
      for (int t = 0; t < n16; ++t) {
        const int64_t row = cache.bf16_row(b, kv, t);
        for (int c = 0; c < d; ++c) {
          bf16k[static_cast<size_t>(t) * d + c] = bf16_to_float(cache.bf16_keys[row * d + c]);
          bf16v[static_cast<size_t>(t) * d + c] = bf16_to_float(cache.bf16_values[row * d + c]);
        }
      }
      for (int j = 0; j < g.group; ++j) {
        const size_t head = static_cast<size_t>(b) * g.num_q_heads() + static_cast<size_t>(kv) * g.group + j;
        const float* q = queries + head * d;
        PartialAttention merged = merge_partials(
            {partial_attention(q, keys.data(), values.data(), n2, d, softmax_scale),
             partial_attention(q, bf16k.data(), bf16v.data(), n16, d, softmax_scale)});
        float* o = out + head * d;
        if (merged.empty()) {
          std::fill(o, o + d, 0.f);
          continue;
        }
        for (int c = 0; c < d; ++c) {
          if (!value_rotation) {
            o[c] = static_cast<float>(merged.output[c]);
            continue;
          }
          double acc = 0;  // o = o' . R_V^T
          for (int i = 0; i < d; ++i) acc += merged.output[i] * value_rotation[static_cast<size_t>(c) * d + i];
          o[c] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace oscar
