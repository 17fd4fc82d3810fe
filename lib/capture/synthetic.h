// Synthetic post-RoPE activations with the structure real decoders show (docs/tools/oscar-capture.md):
// anisotropic queries with a few dominant directions, a handful of large-magnitude key channels,
// RoPE applied by position, an attention-sink first token per sequence, flat values.
#pragma once
#include <cstdint>

#include "io/dump.h"

namespace oscar {

struct SyntheticSpec {
  ModelGeometry geometry;
  int64_t tokens_per_sequence = 1024;
  int sequences = 1;
  uint64_t seed = 0;
  double rope_base = 10000.0;
  int massive_key_channels = 4;  // channels with a large constant offset (low RoPE frequencies)
};

// Activations of one layer for every sequence, [T, H, d] with T = sequences * tokens_per_sequence.
// Deterministic in (seed, layer): any layer can be generated alone.
LayerActivations synthesize_layer(const SyntheticSpec& spec, int layer);

// Applies rotary position embedding in place (half-split pairs (i, i + d/2), angle pos * base^(-2i/d)).
void apply_rope(float* row, int d, int64_t position, double base);

}  // namespace oscar
