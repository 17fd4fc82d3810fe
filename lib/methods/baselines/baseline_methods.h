// The competing methods of shared/spec/baselines.md as oscar-eval KvMethods: kivi, hadamard:kivi, oscars,
// turboquant (+ :qjl, :k3v3) and int4-hadamard. None stores per-token INT2 rows of lib/quant, so each
// encodes a head into dequantised rows in the ORIGINAL basis (rotations, OScaR's logit rescale and
// TurboQuant's inverse rotation are folded in, which is exact in float64 up to float32 storage of the
// rows) plus an ExternalStorage that says which keys / values are quantised at each context and how
// many bits are stored. They run on the CPU reference backend only.
#pragma once
#include <memory>
#include <string>

#include "methods/kv_method.h"

namespace oscar::baselines {

// Registers every baseline family (called from register_builtin_methods in method_registry.cpp).
void register_baseline_methods();

// Defaults (docs/tools/oscar-eval.md, "Baselines").
constexpr int kKiviGroup = 32;          // paper G; kivi:128 is the other published setting
constexpr int kKiviResidual = 128;      // paper R
constexpr int kOscarsGroup = 32;        // K per-channel groups of 32 tokens, V per-token groups of 32 channels
constexpr int kOscarsTailBlock = 256;   // BF16 tail of 0..255 tokens, quantised 256 at a time
constexpr uint64_t kTurboQuantSeed = 20260522;  // base seed of Pi and the QJL sketch (per layer, head, side)

}  // namespace oscar::baselines
