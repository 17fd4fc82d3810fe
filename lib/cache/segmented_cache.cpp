// Segmented cache construction and storage accounting (see segmented_cache.h).
#include "cache/segmented_cache.h"

#include <algorithm>

#include "common/error.h"
#include "common/float16.h"

namespace oscar {

TierSplit split_context(int64_t context, const CacheLayout& layout) {
  OSCAR_CHECK(context >= 0, "negative context {}", context);
  OSCAR_CHECK(layout.sink_tokens >= 0 && layout.recent_tokens >= 0 && layout.page_tokens > 0,
              "bad cache layout: sink {} recent {} page {}", layout.sink_tokens, layout.recent_tokens,
              layout.page_tokens);
  TierSplit split;
  split.sink = std::min<int64_t>(context, layout.sink_tokens);
  const int64_t past_sink = context - split.sink;
  const int64_t page = layout.effective_page();
  if (past_sink >= layout.recent_tokens) split.history = page * ((past_sink - layout.recent_tokens) / page);
  split.recent = past_sink - split.history;
  return split;
}

QuantizedRows slice_rows(const QuantizedRows& rows, int first, int count) {
  OSCAR_CHECK(first >= 0 && count >= 0 && first + count <= rows.rows, "row slice [{}, {}) outside {} rows", first,
              first + count, rows.rows);
  QuantizedRows out;
  out.rows = count;
  out.dim = rows.dim;
  out.bits = rows.bits;
  out.group_size = rows.group_size;
  out.metadata = rows.metadata;
  const size_t row_bytes = static_cast<size_t>(packed_row_bytes(rows.dim, rows.bits));
  const size_t groups = rows.group_size > 0 ? static_cast<size_t>(rows.groups()) : 0;
  out.packed.assign(rows.packed.begin() + first * row_bytes, rows.packed.begin() + (first + count) * row_bytes);
  out.scale.assign(rows.scale.begin() + first * groups, rows.scale.begin() + (first + count) * groups);
  out.zero.assign(rows.zero.begin() + first * groups, rows.zero.begin() + (first + count) * groups);
  return out;
}

void append_rows(QuantizedRows& rows, const QuantizedRows& more) {
  if (rows.rows == 0 && rows.packed.empty()) {
    rows = more;
    return;
  }
  OSCAR_CHECK(rows.dim == more.dim && rows.bits == more.bits && rows.group_size == more.group_size &&
                  rows.metadata == more.metadata,
              "appending quantised rows of a different geometry");
  rows.rows += more.rows;
  rows.packed.insert(rows.packed.end(), more.packed.begin(), more.packed.end());
  rows.scale.insert(rows.scale.end(), more.scale.begin(), more.scale.end());
  rows.zero.insert(rows.zero.end(), more.zero.begin(), more.zero.end());
}

double cache_storage_bits(const SegmentedCacheView& cache) {
  double bits = 2.0 * 16.0 * cache.dim * static_cast<double>(cache.sink_tokens + cache.recent_tokens);
  if (cache.history_keys) bits += cache.history_keys->storage_bits();
  if (cache.history_values) bits += cache.history_values->storage_bits();
  return bits;
}

double cache_bits_per_element(const SegmentedCacheView& cache) {
  const double elements = 2.0 * cache.total_tokens() * cache.dim;
  return elements > 0 ? cache_storage_bits(cache) / elements : 0.0;
}

// ---- SegmentedCache -------------------------------------------------------------------------------

SegmentedCache::SegmentedCache(int dim, const CacheLayout& layout, const QuantizerConfig& key_quantizer,
                               const QuantizerConfig& value_quantizer)
    : dim_(dim), layout_(layout), key_quantizer_(key_quantizer), value_quantizer_(value_quantizer) {
  validate_quantizer(key_quantizer, dim);
  validate_quantizer(value_quantizer, dim);
  split_context(0, layout);  // validates the layout
}

void SegmentedCache::append(const float* key_row, const float* value_row) {
  auto push = [&](std::vector<float>& dst, const float* row) {
    for (int i = 0; i < dim_; ++i) dst.push_back(round_to_bf16(row[i]));
  };
  if (sink_count_ < layout_.sink_tokens) {
    push(sink_keys_, key_row);
    push(sink_values_, value_row);
    ++sink_count_;
    return;
  }
  // The recent window keeps the rotated float row until demotion; BF16 rounding happens at storage,
  // and demotion quantises the stored (BF16) row, as a serving engine that only has the BF16 cache does.
  push(recent_keys_, key_row);
  push(recent_values_, value_row);
  ++recent_count_;
  if (recent_count_ >= layout_.recent_tokens + layout_.effective_page()) demote_page();
}

void SegmentedCache::demote_page() {
  const int page = layout_.effective_page();
  const size_t n = static_cast<size_t>(page) * dim_;
  append_rows(history_keys_, quantize_rows(recent_keys_.data(), page, dim_, key_quantizer_));
  append_rows(history_values_, quantize_rows(recent_values_.data(), page, dim_, value_quantizer_));
  recent_keys_.erase(recent_keys_.begin(), recent_keys_.begin() + n);
  recent_values_.erase(recent_values_.begin(), recent_values_.begin() + n);
  recent_count_ -= page;
}

SegmentedCacheView SegmentedCache::view() const {
  SegmentedCacheView v;
  v.dim = dim_;
  v.sink_tokens = static_cast<int>(sink_count_);
  v.sink_keys = sink_keys_.data();
  v.sink_values = sink_values_.data();
  if (history_keys_.rows > 0) {
    v.history_keys = &history_keys_;
    v.history_values = &history_values_;
  }
  v.recent_tokens = static_cast<int>(recent_count_);
  v.recent_keys = recent_keys_.data();
  v.recent_values = recent_values_.data();
  return v;
}

// ---- EncodedSequence ------------------------------------------------------------------------------

EncodedSequence EncodedSequence::encode(const float* rotated_keys, const float* rotated_values, int64_t tokens,
                                        int dim, const QuantizerConfig& key_quantizer,
                                        const QuantizerConfig& value_quantizer, bool quantize) {
  EncodedSequence e;
  e.tokens = tokens;
  e.dim = dim;
  const size_t n = static_cast<size_t>(tokens) * dim;
  e.window_keys.resize(n);
  e.window_values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    e.window_keys[i] = round_to_bf16(rotated_keys[i]);
    e.window_values[i] = round_to_bf16(rotated_values[i]);
  }
  if (quantize && tokens > 0) {
    // Quantise the BF16 rows: the history is demoted from the BF16 recent window (SegmentedCache).
    e.quantized_keys = quantize_rows(e.window_keys.data(), static_cast<int>(tokens), dim, key_quantizer);
    e.quantized_values = quantize_rows(e.window_values.data(), static_cast<int>(tokens), dim, value_quantizer);
    e.dequantized_keys.resize(n);
    e.dequantized_values.resize(n);
    dequantize_rows(e.quantized_keys, e.dequantized_keys.data());
    dequantize_rows(e.quantized_values, e.dequantized_values.data());
  }
  return e;
}

const float* EncodedSequence::key_row(int64_t j, const TierSplit& tiers) const {
  const TierSplit split = key_split(tiers);
  const bool history = j >= split.history_begin() && j < split.recent_begin();
  return (history ? dequantized_keys.data() : window_keys.data()) + static_cast<size_t>(j) * dim;
}

const float* EncodedSequence::value_row(int64_t j, const TierSplit& tiers) const {
  const TierSplit split = value_split(tiers);
  const bool history = j >= split.history_begin() && j < split.recent_begin();
  return (history ? dequantized_values.data() : window_values.data()) + static_cast<size_t>(j) * dim;
}

CacheSnapshot::CacheSnapshot(const EncodedSequence& encoded, const TierSplit& split) : split_(split) {
  OSCAR_CHECK(split.total() <= encoded.tokens, "cache of {} tokens asked from a sequence of {}", split.total(),
              encoded.tokens);
  if (encoded.external) {
    // Rows as the decode reads them, presented as one float tier (the CPU reference attends to it in float64).
    const int64_t n = split.total();
    const size_t d = static_cast<size_t>(encoded.dim);
    external_keys_.resize(n * d);
    external_values_.resize(n * d);
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(encoded.key_row(j, split), d, external_keys_.data() + j * d);
      std::copy_n(encoded.value_row(j, split), d, external_values_.data() + j * d);
    }
    external_bits_ = n > 0 ? encoded.external->storage_bits(n) / (2.0 * static_cast<double>(n) * encoded.dim) : 0.0;
    view_.dim = encoded.dim;
    view_.sink_tokens = static_cast<int>(n);
    view_.sink_keys = external_keys_.data();
    view_.sink_values = external_values_.data();
    return;
  }
  OSCAR_CHECK(split.history == 0 || encoded.quantized_keys.rows >= split.recent_begin(),
              "this method stores no quantised tier, but the layout puts {} tokens in history", split.history);
  const size_t d = static_cast<size_t>(encoded.dim);
  view_.dim = encoded.dim;
  view_.sink_tokens = static_cast<int>(split.sink);
  view_.sink_keys = encoded.window_keys.data();
  view_.sink_values = encoded.window_values.data();
  if (split.history > 0) {
    history_keys_ = slice_rows(encoded.quantized_keys, static_cast<int>(split.sink), static_cast<int>(split.history));
    history_values_ =
        slice_rows(encoded.quantized_values, static_cast<int>(split.sink), static_cast<int>(split.history));
    view_.history_keys = &history_keys_;
    view_.history_values = &history_values_;
  }
  view_.recent_tokens = static_cast<int>(split.recent);
  view_.recent_keys = encoded.window_keys.data() + split.recent_begin() * d;
  view_.recent_values = encoded.window_values.data() + split.recent_begin() * d;
}

double CacheSnapshot::bits_per_element() const {
  return external_bits_ >= 0 ? external_bits_ : cache_bits_per_element(view_);
}

}  // namespace oscar
