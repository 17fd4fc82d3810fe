// CUDA decode backend: implements make_cuda_decode_backend() (declared in decode_backend.h).
#include "backend/decode_backend.h"
#include "common/error.h"

namespace oscar {
std::unique_ptr<DecodeBackend> make_cuda_decode_backend() { fail("cuda backend: not implemented yet"); }
}  // namespace oscar
