// Our decoder of zlib streams (RFC 1950 framing around RFC 1951 deflate): the chunks of a
// compressed dump. It replaces zlib's inflate on the read path because the chunks of 16-bit
// activations are mostly Huffman-coded literals (the shuffled high bytes) and stored blocks (the
// low bytes), which zlib decodes one symbol per table lookup: here a lookup yields up to two
// literals, the bit buffer is 64 bits wide and refilled without branches.
#pragma once
#include <cstddef>
#include <cstdint>

namespace oscar::h5 {

// Decodes the zlib stream in[0, in_size) into out[0, out_size). True only if the stream is well
// formed, holds exactly out_size bytes and its adler-32 checksum matches; false for anything
// truncated, corrupt or of another length (out's contents are then unspecified). Bytes after the
// checksum are ignored, as zlib does.
bool inflate_zlib(const unsigned char* in, size_t in_size, unsigned char* out, size_t out_size);

}  // namespace oscar::h5
