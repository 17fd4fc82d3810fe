// Decoding of zlib streams; see inflate.h. The format is RFC 1950/1951; the decoding tables are
// indexed by the next bits of the stream (codes are stored least significant bit first), codes
// longer than the root index go through a second-level table.
#include "io/inflate.h"

#include <immintrin.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace oscar::h5 {
namespace {

// A table entry is 32 bits, [0, 6) the bits its code(s) take (bit 5 is zero, so the bit buffer
// shifts by the entry itself). A literal entry has bit 31 set (a sign test), bit 30 when it holds
// two literals, and the literals in [8, 16) and [16, 24). Any other entry: [6, 9) the kind, [9, 16)
// extra bits (length, distance) or index bits (subtable), [16, 31) the value: base length or
// distance, the subtable's offset, or a symbol of the code-length code.
enum Kind : uint32_t { kSymbol = 0, kLength = 2, kDistance = 3, kEnd = 4, kSubtable = 5, kBad = 6 };
constexpr uint32_t kLiteralFlag = 1u << 31, kPairFlag = 1u << 30;
constexpr uint32_t entry(uint32_t bits, Kind kind, uint32_t extra, uint32_t value) {
  return bits | kind << 6 | extra << 9 | value << 16;
}
constexpr uint32_t literal_entry(uint32_t bits, uint32_t literal) { return kLiteralFlag | literal << 8 | bits; }
inline bool is_literal(uint32_t e) { return static_cast<int32_t>(e) < 0; }
inline uint32_t literals_in(uint32_t e) { return 1 + (e >> 30 & 1); }  // of a literal entry
inline uint32_t bits_of(uint32_t e) { return e & 63; }
inline uint32_t kind_of(uint32_t e) { return e >> 6 & 7; }  // of any other entry
inline uint32_t extra_of(uint32_t e) { return e >> 9 & 127; }
inline uint32_t value_of(uint32_t e) { return e >> 16; }
inline bool is_subtable(uint32_t e) { return (e & (kLiteralFlag | 7u << 6)) == kSubtable << 6; }

constexpr int kLitRootBits = 12;   // literal/length root table: 4096 entries
constexpr int kDistRootBits = 8;   // distance root table
constexpr int kMaxCodeBits = 15;
// Room for the root and every subtable of a complete code (each subtable holds at least as many
// codes as the log of its size plus one, so these bounds are loose).
constexpr int kLitTableSize = (1 << kLitRootBits) + 288 * (1 << (kMaxCodeBits - kLitRootBits));
constexpr int kDistTableSize = (1 << kDistRootBits) + 32 * (1 << (kMaxCodeBits - kDistRootBits));

constexpr std::array<uint16_t, 29> kLengthBase = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                                  31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr std::array<uint8_t, 29> kLengthExtra = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                  2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr std::array<uint16_t, 30> kDistBase = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,
                                                33,  49,  65,  97,  129, 193,  257,  385,  513,  769,
                                                1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr std::array<uint8_t, 30> kDistExtra = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                                6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
// The order in which a dynamic block lists the lengths of the code-length code.
constexpr std::array<uint8_t, 19> kCodeLengthOrder = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

uint32_t literal_length_entry(int symbol) {
  if (symbol < 256) return literal_entry(0, static_cast<uint32_t>(symbol));
  if (symbol == 256) return entry(0, kEnd, 0, 0);
  if (symbol <= 285) return entry(0, kLength, kLengthExtra[symbol - 257], kLengthBase[symbol - 257]);
  return entry(0, kBad, 0, 0);
}
uint32_t distance_entry(int symbol) {
  return symbol < 30 ? entry(0, kDistance, kDistExtra[symbol], kDistBase[symbol]) : entry(0, kBad, 0, 0);
}
uint32_t code_length_entry(int symbol) { return entry(0, kSymbol, 0, static_cast<uint32_t>(symbol)); }

uint32_t reverse_bits(uint32_t code, int length) {
  uint32_t r = 0;
  for (int i = 0; i < length; ++i, code >>= 1) r = r << 1 | (code & 1);
  return r;
}

// Fills `table` (root of 2^root entries, then subtables) for the canonical code of the given code
// lengths. False for an over-subscribed set, or an incomplete one (allowed, as zlib allows it, only
// when it is a single code of length 1, or no code at all if `allow_empty`). Entries no code
// reaches are kBad. The root is built for codes of length 1, 2, ... in turn, doubling it (a copy)
// before each length, which repeats every shorter code at all the indices it owns.
template <typename EntryOf>
bool build_table(const uint8_t* lengths, int symbols, int root, bool allow_empty, EntryOf entry_of, uint32_t* table,
                 int capacity) {
  int count[kMaxCodeBits + 1] = {};
  for (int s = 0; s < symbols; ++s) ++count[lengths[s]];
  count[0] = 0;
  int left = 1, max_length = 0;
  for (int len = 1; len <= kMaxCodeBits; ++len) {
    left = 2 * left - count[len];
    if (left < 0) return false;  // over-subscribed
    if (count[len]) max_length = len;
  }
  if (max_length == 0 && !allow_empty) return false;
  if (left > 0 && max_length > 1) return false;  // incomplete
  // Symbols sorted by code length, then symbol: the canonical code order.
  int offset[kMaxCodeBits + 2] = {};
  for (int len = 1; len <= kMaxCodeBits; ++len) offset[len + 1] = offset[len] + count[len];
  uint16_t sorted[288];
  for (int s = 0; s < symbols; ++s)
    if (lengths[s]) sorted[offset[lengths[s]]++] = static_cast<uint16_t>(s);
  table[0] = table[1] = entry(0, kBad, 0, 0);
  uint32_t code = 0;  // the next canonical code, most significant bit first
  int k = 0;          // the next symbol in canonical order
  for (int len = 1; len <= root; ++len, code <<= 1) {
    if (len > 1) std::memcpy(table + (1 << (len - 1)), table, sizeof(uint32_t) << (len - 1));
    for (int i = 0; i < count[len]; ++i, ++code, ++k)
      table[reverse_bits(code, len)] = entry_of(sorted[k]) | static_cast<uint32_t>(len);
  }
  // Longer codes, in canonical order, share a root prefix in runs; the last of a run is its longest.
  int used = 1 << root;
  const int first_long = k;
  uint32_t long_codes[288];
  for (int len = root + 1; len <= kMaxCodeBits; ++len, code <<= 1)
    for (int i = 0; i < count[len]; ++i, ++code, ++k) long_codes[k - first_long] = reverse_bits(code, len);
  const uint32_t prefix_mask = (1u << root) - 1;
  for (int run = first_long; run < k;) {
    const uint32_t prefix = long_codes[run - first_long] & prefix_mask;
    int end = run;
    while (end < k && (long_codes[end - first_long] & prefix_mask) == prefix) ++end;
    const int sub_bits = lengths[sorted[end - 1]] - root;
    if (used + (1 << sub_bits) > capacity) return false;
    uint32_t* sub = table + used;
    std::fill(sub, sub + (1 << sub_bits), entry(0, kBad, 0, 0));
    table[prefix] = entry(static_cast<uint32_t>(root), kSubtable, static_cast<uint32_t>(sub_bits),
                          static_cast<uint32_t>(used));
    for (; run < end; ++run) {
      const int len = lengths[sorted[run]];
      const uint32_t e = entry_of(sorted[run]) | static_cast<uint32_t>(len);
      for (uint32_t i = long_codes[run - first_long] >> root; i < (1u << sub_bits); i += 1u << (len - root)) sub[i] = e;
    }
    used += 1 << sub_bits;
  }
  return true;
}

// Where two literals' codes fit in the root index together, one lookup yields both. Descending, so
// that the entry looked up for the second literal (at a lower index) is still a single one.
void pair_literals_below(uint32_t* table, int end) {
  for (int i = end - 1; i >= 0; --i) {
    const uint32_t first = table[i];
    const uint32_t second = table[static_cast<uint32_t>(i) >> bits_of(first)];
    const uint32_t single_mask = kLiteralFlag | kPairFlag;
    const bool pair = (first & single_mask) == kLiteralFlag && (second & single_mask) == kLiteralFlag &&
                      bits_of(first) + bits_of(second) <= kLitRootBits;
    const uint32_t joined = kLiteralFlag | kPairFlag | (second & 0xff00) << 8 | (first & 0xff00) |
                            (bits_of(first) + bits_of(second));
    table[i] = pair ? joined : first;
  }
}

// The same, 8 entries a step (it runs once per Huffman block: scalar, it was ~20 % of the decoding).
// From index 8 on, the second literal's entry (index at most i / 2) lies below the step's entries.
__attribute__((target("avx2"))) void pair_literals_avx2(uint32_t* table) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i bits_mask = _mm256_set1_epi32(63), single_mask = _mm256_set1_epi32(kLiteralFlag | kPairFlag);
  const __m256i single = _mm256_set1_epi32(kLiteralFlag), pair_flags = _mm256_set1_epi32(kLiteralFlag | kPairFlag);
  const __m256i literal_mask = _mm256_set1_epi32(0xff00);
  const __m256i too_long = _mm256_set1_epi32(kLitRootBits + 1);
  for (int base = (1 << kLitRootBits) - 8; base >= 8; base -= 8) {
    const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + base));
    const __m256i first_bits = _mm256_and_si256(first, bits_mask);
    const __m256i index = _mm256_srlv_epi32(_mm256_add_epi32(_mm256_set1_epi32(base), lanes), first_bits);
    const __m256i second = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), index, 4);
    const __m256i both_bits = _mm256_add_epi32(first_bits, _mm256_and_si256(second, bits_mask));
    const __m256i pair = _mm256_and_si256(
        _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(first, single_mask), single),
                         _mm256_cmpeq_epi32(_mm256_and_si256(second, single_mask), single)),
        _mm256_cmpgt_epi32(too_long, both_bits));
    const __m256i literals = _mm256_or_si256(_mm256_and_si256(first, literal_mask),
                                             _mm256_slli_epi32(_mm256_and_si256(second, literal_mask), 8));
    const __m256i joined = _mm256_or_si256(_mm256_or_si256(both_bits, pair_flags), literals);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(table + base), _mm256_blendv_epi8(first, joined, pair));
  }
  pair_literals_below(table, 8);
}

void pair_literals(uint32_t* table) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return pair_literals_avx2(table);
  pair_literals_below(table, 1 << kLitRootBits);
}

struct Tables {
  uint32_t literal[kLitTableSize];
  uint32_t distance[kDistTableSize];
};

// The input as a 64-bit buffer of the next bits. Past the end of the input it reads zero bytes and
// counts them; a stream that consumes them is truncated.
class BitReader {
 public:
  BitReader(const unsigned char* p, const unsigned char* end) : p_(p), end_(end) {}
  // At least 56 bits in the buffer afterwards.
  void refill() {
    if (end_ - p_ >= 8) {  // whole 8-byte load; the bytes beyond the count are re-read next time
      uint64_t word;
      std::memcpy(&word, p_, 8);
      buffer_ |= word << count_;
      p_ += (63 - count_) >> 3;
      count_ |= 56;
    } else {
      while (count_ <= 56) {
        if (p_ < end_) buffer_ |= static_cast<uint64_t>(*p_++) << count_;
        else ++padding_;
        count_ += 8;
      }
    }
  }
  uint64_t peek() const { return buffer_; }
  // Drops the bits of a code: n, or a table entry (whose low 6 bits count them).
  void consume(uint32_t n) {
    buffer_ >>= n & 63;
    count_ -= static_cast<int>(n & 63);
  }
  uint32_t take(uint32_t n) {  // n <= 32, with n bits in the buffer
    const uint32_t v = static_cast<uint32_t>(buffer_ & ((uint64_t{1} << n) - 1));
    consume(n);
    return v;
  }
  // Drops the bits to the next byte boundary and hands back the buffered whole bytes: the position of
  // the next byte, or nullptr if the stream already read past the end of the input.
  const unsigned char* align() {
    const int whole = count_ / 8;
    if (padding_ > whole) return nullptr;
    p_ -= whole - padding_;
    buffer_ = 0;
    count_ = 0;
    padding_ = 0;
    return p_;
  }
  void seek(const unsigned char* p) { p_ = p; }
  const unsigned char* end() const { return end_; }

 private:
  const unsigned char* p_;
  const unsigned char* end_;
  uint64_t buffer_ = 0;
  int count_ = 0;    // bits in the buffer
  int padding_ = 0;  // zero bytes read past the end
};

enum class Step { kEndOfBlock, kError, kNearEnd };

// Copies a match of `length` bytes from `distance` back. Unchecked: the caller left room for the
// 8-byte over-copy.
inline void copy_match(unsigned char* out, uint32_t distance, uint32_t length) {
  const unsigned char* from = out - distance;
  if (distance >= 8) {
    for (uint32_t i = 0; i < length; i += 8) std::memcpy(out + i, from + i, 8);
  } else if (distance == 1) {
    std::memset(out, *from, length);
  } else {
    for (uint32_t i = 0; i < length; ++i) out[i] = from[i];
  }
}

// Decodes the symbols of one Huffman block up to its end-of-block code. Unchecked, it returns
// kNearEnd when fewer than kRoom bytes of output are left (the checked version then finishes).
constexpr ptrdiff_t kRoom = 258 + 8 + 2;
template <bool kChecked>
Step decode_symbols(BitReader& reader, const Tables& t, const unsigned char* out_begin, unsigned char*& out_pos,
                    unsigned char* out_end) {
  // Local copies, so that they stay in registers: the output's byte stores could alias them.
  BitReader in = reader;
  unsigned char* out = out_pos;
  Step step = Step::kError;
  constexpr uint64_t kLitMask = (1u << kLitRootBits) - 1, kDistMask = (1u << kDistRootBits) - 1;
  auto lookup = [&](const uint32_t* table, uint64_t mask, int root) {
    uint32_t e = table[in.peek() & mask];
    if (is_subtable(e)) e = table[value_of(e) + ((in.peek() >> root) & ((1u << extra_of(e)) - 1))];
    return e;
  };
  // A literal entry's one or two bytes (unchecked, the second is written even for one: room is left).
  auto put_literals = [&](uint32_t e) {
    const uint32_t n = literals_in(e);
    if (kChecked && out_end - out < static_cast<ptrdiff_t>(n)) return false;
    if (kChecked) {
      out[0] = static_cast<unsigned char>(e >> 8);
      if (n == 2) out[1] = static_cast<unsigned char>(e >> 16);
    } else {
      const uint16_t both = static_cast<uint16_t>(e >> 8);
      std::memcpy(out, &both, 2);
    }
    out += n;
    in.consume(e);
    return true;
  };
  for (;;) {
    if (!kChecked && out_end - out < kRoom) {
      step = Step::kNearEnd;
      break;
    }
    in.refill();
    uint32_t e = lookup(t.literal, kLitMask, kLitRootBits);
    if (is_literal(e)) {
      if (!put_literals(e)) break;
      // A second entry from the same refill (>= 41 bits left).
      e = lookup(t.literal, kLitMask, kLitRootBits);
      if (!is_literal(e)) continue;  // looked up again after the next refill
      if (!put_literals(e)) break;
      continue;
    }
    if (kind_of(e) == kEnd) {
      in.consume(e);
      step = Step::kEndOfBlock;
      break;
    }
    if (kind_of(e) != kLength) break;
    in.consume(e);
    const uint32_t length = value_of(e) + in.take(extra_of(e));  // <= 20 bits so far
    const uint32_t d = lookup(t.distance, kDistMask, kDistRootBits);
    if (kind_of(d) != kDistance) break;
    in.consume(d);
    const uint32_t distance = value_of(d) + in.take(extra_of(d));  // <= 48 bits in all
    if (distance > static_cast<size_t>(out - out_begin)) break;
    if (kChecked) {
      if (length > static_cast<size_t>(out_end - out)) break;
      const unsigned char* from = out - distance;
      for (uint32_t i = 0; i < length; ++i) out[i] = from[i];
    } else {
      copy_match(out, distance, length);
    }
    out += length;
  }
  reader = in;
  out_pos = out;
  return step;
}

bool decode_huffman_block(BitReader& in, const Tables& t, const unsigned char* out_begin, unsigned char*& out,
                          unsigned char* out_end) {
  Step step = decode_symbols<false>(in, t, out_begin, out, out_end);
  if (step == Step::kNearEnd) step = decode_symbols<true>(in, t, out_begin, out, out_end);
  return step == Step::kEndOfBlock;
}

// The literal/length table (with its literal pairs) and the distance table of a Huffman block. A
// block of literals only may have no distance code.
bool build_tables(const uint8_t* literal_lengths, int literal_codes, const uint8_t* distance_lengths,
                  int distance_codes, Tables& t) {
  if (!build_table(literal_lengths, literal_codes, kLitRootBits, false, literal_length_entry, t.literal,
                   kLitTableSize))
    return false;
  pair_literals(t.literal);
  return build_table(distance_lengths, distance_codes, kDistRootBits, true, distance_entry, t.distance,
                     kDistTableSize);
}

bool build_fixed_tables(Tables& t) {
  uint8_t lengths[288 + 32];
  std::fill(lengths, lengths + 144, 8);
  std::fill(lengths + 144, lengths + 256, 9);
  std::fill(lengths + 256, lengths + 280, 7);
  std::fill(lengths + 280, lengths + 288, 8);
  std::fill(lengths + 288, lengths + 320, 5);
  return build_tables(lengths, 288, lengths + 288, 32, t);
}

bool build_dynamic_tables(BitReader& in, Tables& t) {
  in.refill();
  const int literal_codes = static_cast<int>(in.take(5)) + 257;
  const int distance_codes = static_cast<int>(in.take(5)) + 1;
  const int length_codes = static_cast<int>(in.take(4)) + 4;
  if (literal_codes > 286 || distance_codes > 30) return false;
  uint8_t code_lengths[19] = {};
  for (int i = 0; i < length_codes; ++i) {
    in.refill();
    code_lengths[kCodeLengthOrder[i]] = static_cast<uint8_t>(in.take(3));
  }
  uint32_t code_table[1 << 7];
  if (!build_table(code_lengths, 19, 7, false, code_length_entry, code_table, 1 << 7)) return false;
  uint8_t lengths[286 + 30] = {};
  const int total = literal_codes + distance_codes;
  for (int i = 0; i < total;) {
    in.refill();
    const uint32_t e = code_table[in.peek() & 127];
    if (is_literal(e) || kind_of(e) != kSymbol) return false;
    in.consume(bits_of(e));
    const uint32_t symbol = value_of(e);
    if (symbol < 16) {
      lengths[i++] = static_cast<uint8_t>(symbol);
      continue;
    }
    uint8_t value = 0;
    int repeat = 0;
    if (symbol == 16) {
      if (i == 0) return false;
      value = lengths[i - 1];
      repeat = 3 + static_cast<int>(in.take(2));
    } else if (symbol == 17) {
      repeat = 3 + static_cast<int>(in.take(3));
    } else {
      repeat = 11 + static_cast<int>(in.take(7));
    }
    if (i + repeat > total) return false;
    std::fill(lengths + i, lengths + i + repeat, value);
    i += repeat;
  }
  if (lengths[256] == 0) return false;  // no end-of-block code
  return build_tables(lengths, literal_codes, lengths + literal_codes, distance_codes, t);
}

// Adler-32 (RFC 1950) with AVX2, 32 bytes a step: over a run of k steps starting from (s1, s2), a
// byte at position j of the run adds b_j to s1 and (32k - j) b_j to s2, which splits into
// 32 (k - 1 - step) b_j (the running byte sums, added up once per step) plus (32 - lane) b_j (a
// weighted sum per step). Runs stay short enough (kRun) for 32-bit lanes; sums are reduced mod 65521
// after each run.
constexpr uint32_t kAdlerBase = 65521;
__attribute__((target("avx2"))) uint64_t sum_lanes(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}
__attribute__((target("avx2"))) uint32_t adler32_avx2(const unsigned char* p, size_t n) {
  constexpr size_t kRun = 5536 / 32;  // 32 * kRun bytes keep s2 below 2^32 (zlib's NMAX is 5552)
  uint64_t s1 = 1, s2 = 0;
  const __m256i weights = _mm256_setr_epi8(32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15,
                                           14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
  const __m256i ones = _mm256_set1_epi16(1), zero = _mm256_setzero_si256();
  while (n >= 32) {
    const size_t steps = std::min(n / 32, kRun);
    __m256i bytes = zero, prefix = zero, weighted = zero;
    for (size_t i = 0; i < steps; ++i, p += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      prefix = _mm256_add_epi32(prefix, bytes);
      bytes = _mm256_add_epi32(bytes, _mm256_sad_epu8(x, zero));
      weighted = _mm256_add_epi32(weighted, _mm256_madd_epi16(_mm256_maddubs_epi16(x, weights), ones));
    }
    s2 += 32 * steps * s1 + 32 * sum_lanes(prefix) + sum_lanes(weighted);
    s1 += sum_lanes(bytes);
    s1 %= kAdlerBase;
    s2 %= kAdlerBase;
    n -= 32 * steps;
  }
  for (; n; --n) {
    s1 += *p++;
    s2 += s1;
  }
  return static_cast<uint32_t>((s2 % kAdlerBase) << 16 | (s1 % kAdlerBase));
}

uint32_t adler32_of(const unsigned char* p, size_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return adler32_avx2(p, n);
  return static_cast<uint32_t>(adler32_z(1, p, n));
}

}  // namespace

bool inflate_zlib(const unsigned char* in, size_t in_size, unsigned char* out, size_t out_size) {
  if (in_size < 2) return false;
  const unsigned cmf = in[0], flg = in[1];
  if ((cmf & 15) != 8 || (cmf >> 4) > 7 || (cmf * 256 + flg) % 31 != 0 || (flg & 32)) return false;
  thread_local Tables tables;
  BitReader bits(in + 2, in + in_size);
  unsigned char* const out_begin = out;
  unsigned char* const out_end = out + out_size;
  for (bool last = false; !last;) {
    bits.refill();
    last = bits.take(1);
    const uint32_t type = bits.take(2);
    if (type == 0) {  // stored
      const unsigned char* p = bits.align();
      if (!p || bits.end() - p < 4) return false;
      const size_t length = p[0] | p[1] << 8, check = p[2] | p[3] << 8;
      p += 4;
      if ((length ^ 0xffff) != check || static_cast<size_t>(bits.end() - p) < length ||
          static_cast<size_t>(out_end - out) < length)
        return false;
      std::memcpy(out, p, length);
      out += length;
      bits.seek(p + length);
    } else if (type == 1 || type == 2) {
      if (!(type == 1 ? build_fixed_tables(tables) : build_dynamic_tables(bits, tables))) return false;
      if (!decode_huffman_block(bits, tables, out_begin, out, out_end)) return false;
    } else {
      return false;
    }
  }
  const unsigned char* p = bits.align();
  if (!p || bits.end() - p < 4 || out != out_end) return false;
  const uint32_t expected = static_cast<uint32_t>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
  return adler32_of(out_begin, out_size) == expected;
}

}  // namespace oscar::h5
