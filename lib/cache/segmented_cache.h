// The segmented KV cache of one sequence and one KV head as serving stores it (oscar-method.md
// section 5): BF16 sink [0, S0) | quantised history | BF16 recent window, all in rotated space,
// with tokens demoted from the recent window in pages; and its storage in bits (BPE from storage).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/decode_backend.h"
#include "quant/quantizer.h"

namespace oscar {

struct CacheLayout {
  int sink_tokens = 64;    // S0: the first tokens of the sequence, kept in BF16
  int recent_tokens = 256;  // W: the recent window in BF16 (holds W .. W+page-1 tokens between demotions)
  int page_tokens = 8;     // demotion granularity; a zero-length recent window quantises every token at once
  int effective_page() const { return recent_tokens == 0 ? 1 : page_tokens; }
};

// How many tokens of a cache holding `context` tokens sit in each tier.
struct TierSplit {
  int64_t sink = 0, history = 0, recent = 0;
  int64_t total() const { return sink + history + recent; }
  int64_t history_begin() const { return sink; }
  int64_t recent_begin() const { return sink + history; }
};

// The serving rule: the first S0 tokens fill the sink; later tokens enter the recent window, and when it
// reaches W + page tokens its oldest page is demoted. So history = page * floor((n - W) / page) for
// n = context - S0 >= W tokens past the sink, else 0.
TierSplit split_context(int64_t context, const CacheLayout& layout);

// Rows [first, first + count) of a quantised block (a copy; same bits, group size, metadata).
QuantizedRows slice_rows(const QuantizedRows& rows, int first, int count);
// Appends the rows of `more` to `rows` (same geometry; an empty `rows` takes `more`'s geometry).
void append_rows(QuantizedRows& rows, const QuantizedRows& more);

// Storage of a cache in bits: codes + metadata of the quantised history (K and V) + 16 bits per element
// of the BF16 sink and recent windows (K and V).
double cache_storage_bits(const SegmentedCacheView& cache);
// Effective bits per element: cache_storage_bits / (2 * tokens * d). 0 for an empty cache.
double cache_bits_per_element(const SegmentedCacheView& cache);

// A cache built token by token, exactly as a serving engine builds it: append() takes one rotated key
// and value row; windows round to BF16; demoted pages are clipped, quantised and packed.
class SegmentedCache {
 public:
  SegmentedCache(int dim, const CacheLayout& layout, const QuantizerConfig& key_quantizer,
                 const QuantizerConfig& value_quantizer);
  void append(const float* key_row, const float* value_row);  // [d] each, rotated
  int64_t tokens() const { return sink_count_ + history_keys_.rows + recent_count_; }
  TierSplit split() const { return {sink_count_, history_keys_.rows, recent_count_}; }
  SegmentedCacheView view() const;  // valid until the next append()
  const QuantizedRows& history_keys() const { return history_keys_; }
  const QuantizedRows& history_values() const { return history_values_; }

 private:
  void demote_page();
  int dim_;
  CacheLayout layout_;
  QuantizerConfig key_quantizer_, value_quantizer_;
  int64_t sink_count_ = 0, recent_count_ = 0;
  std::vector<float> sink_keys_, sink_values_;      // [sink_count, d], BF16-rounded
  std::vector<float> recent_keys_, recent_values_;  // [recent_count, d], BF16-rounded, oldest first
  QuantizedRows history_keys_, history_values_;     // [H, d]
};

// Storage of a method whose quantised tier is not per-token QuantizedRows (lib/methods/baselines:
// per-channel groups across tokens, codebooks, norms, and K and V windows that differ): the method says
// which keys and which values are read in their dequantised form at each context, and how many bits it
// stores. Such a cache is decoded from dequantised rows by the CPU reference backend.
class ExternalStorage {
 public:
  virtual ~ExternalStorage() = default;
  // Tiers of the keys / values of a cache holding `context` tokens ([sink, sink + history) dequantised).
  virtual TierSplit key_split(int64_t context) const = 0;
  virtual TierSplit value_split(int64_t context) const = 0;
  // Bits stored for K and V of this head at `context`: codes, all metadata, full-precision windows.
  virtual double storage_bits(int64_t context) const = 0;
};

// Every token of one sequence (one KV head) encoded both ways a cache may store it: BF16 window rows
// and quantised rows. Since both are per token, the cache at any context c <= tokens is assembled by
// picking each token's form from split_context(c): the history is quantised once and reused for every
// decode position (identical to SegmentedCache fed the same rows; tested).
struct EncodedSequence {
  int64_t tokens = 0;
  int dim = 0;
  std::vector<float> window_keys, window_values;  // [tokens, d] rotated, BF16-rounded
  QuantizedRows quantized_keys, quantized_values;  // [tokens, d] (rows = 0 when nothing is ever quantised)
  std::vector<float> dequantized_keys, dequantized_values;  // [tokens, d] = dequantize(quantized_*)
  // Set by methods with their own storage (quantized_* then stay empty; dequantized_* hold every token's
  // quantised form): key_row / value_row follow its K and V splits and CacheSnapshot its bits.
  std::shared_ptr<const ExternalStorage> external;

  // Rotated rows [tokens, d]: windows get BF16 rounding, every row is quantised with the configs
  // (when quantize is false, only the window form exists and split() must put no token in history).
  static EncodedSequence encode(const float* rotated_keys, const float* rotated_values, int64_t tokens, int dim,
                                const QuantizerConfig& key_quantizer, const QuantizerConfig& value_quantizer,
                                bool quantize = true);
  // Key / value row j of the cache at a context with this split, as the decode reads it.
  const float* key_row(int64_t j, const TierSplit& split) const;
  const float* value_row(int64_t j, const TierSplit& split) const;
  // The key / value tiers at this split's context: the external storage's, or the split itself.
  TierSplit key_split(const TierSplit& split) const { return external ? external->key_split(split.total()) : split; }
  TierSplit value_split(const TierSplit& split) const {
    return external ? external->value_split(split.total()) : split;
  }
};

// The cache of an EncodedSequence at one context: owns the history slice, exposes a SegmentedCacheView.
class CacheSnapshot {
 public:
  CacheSnapshot(const EncodedSequence& encoded, const TierSplit& split);
  const SegmentedCacheView& view() const { return view_; }
  const TierSplit& split() const { return split_; }
  // Effective bits per element of this cache (external storage: the method's own count).
  double bits_per_element() const;

 private:
  TierSplit split_;
  QuantizedRows history_keys_, history_values_;
  // External storage: every row as the decode reads it ([context, d] each), exposed as one float tier.
  std::vector<float> external_keys_, external_values_;
  double external_bits_ = -1;
  SegmentedCacheView view_;
};

}  // namespace oscar
