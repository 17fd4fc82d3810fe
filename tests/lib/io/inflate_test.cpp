// Our zlib-stream decoder against zlib itself: every stream zlib writes (each level and strategy,
// every block type) decodes to the same bytes; streams of the wrong length, truncated, corrupt or
// malformed are refused, never read or written out of bounds.
#include "io/inflate.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/float16.h"

namespace oscar::h5 {
namespace {

using Bytes = std::vector<unsigned char>;

Bytes deflate_with(const Bytes& plain, int level, int strategy) {
  Bytes packed(compressBound(static_cast<uLong>(plain.size())) + 64);
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 15, 8, strategy), Z_OK);
  z.next_in = const_cast<unsigned char*>(plain.data());
  z.avail_in = static_cast<uInt>(plain.size());
  z.next_out = packed.data();
  z.avail_out = static_cast<uInt>(packed.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  packed.resize(z.total_out);
  deflateEnd(&z);
  return packed;
}

// Inputs of every character deflate meets: empty, one byte, zeros (long runs), text (strings
// repeated at every distance), random bytes (stored blocks), small periods (matches of distance
// 2-7), and shuffled float16 activations (stored low bytes, literal-heavy high bytes).
std::vector<std::pair<std::string, Bytes>> inputs() {
  std::mt19937 rng(7);
  std::vector<std::pair<std::string, Bytes>> in;
  in.push_back({"empty", {}});
  in.push_back({"one byte", {42}});
  in.push_back({"zeros", Bytes(100000, 0)});
  std::string text;
  for (int i = 0; text.size() < 300000; ++i)
    text += "the " + std::to_string(rng() % 1000) + (i % 7 ? " key " : " value\n");
  in.push_back({"text", Bytes(text.begin(), text.end())});
  Bytes random(70001);
  for (auto& b : random) b = static_cast<unsigned char>(rng());
  in.push_back({"random", random});
  Bytes periods(50000);
  for (size_t i = 0; i < periods.size(); ++i)
    periods[i] = static_cast<unsigned char>("abcdefg"[i % (2 + i / 5000 % 6)]);
  in.push_back({"short periods", periods});
  std::normal_distribution<float> normal;
  const size_t elements = 1 << 17;
  Bytes shuffled(2 * elements);
  for (size_t i = 0; i < elements; ++i) {
    const uint16_t h = float_to_fp16(normal(rng) * (0.2f + 8.0f * static_cast<float>(i % 1024) / 1024.0f));
    shuffled[i] = static_cast<unsigned char>(h & 255);
    shuffled[elements + i] = static_cast<unsigned char>(h >> 8);
  }
  in.push_back({"shuffled float16", shuffled});
  return in;
}

TEST(Inflate, DecodesEveryStreamZlibWrites) {
  for (const auto& [name, plain] : inputs())
    for (int level : {0, 1, 4, 6, 9})
      for (int strategy : {Z_DEFAULT_STRATEGY, Z_FILTERED, Z_HUFFMAN_ONLY, Z_RLE, Z_FIXED}) {
        const Bytes packed = deflate_with(plain, level, strategy);
        const std::string what = name + ", level " + std::to_string(level) + ", strategy " + std::to_string(strategy);
        Bytes out(plain.size() + 1, 0xee);
        ASSERT_TRUE(inflate_zlib(packed.data(), packed.size(), out.data(), plain.size())) << what;
        EXPECT_TRUE(std::equal(plain.begin(), plain.end(), out.begin())) << what;
        EXPECT_EQ(out[plain.size()], 0xee) << what << ": wrote past the end";
        // Another length than the stream holds, or a cut stream, is refused.
        if (!plain.empty())
          EXPECT_FALSE(inflate_zlib(packed.data(), packed.size(), out.data(), plain.size() - 1)) << what;
        EXPECT_FALSE(inflate_zlib(packed.data(), packed.size(), out.data(), plain.size() + 1)) << what;
        for (size_t cut : {size_t{1}, size_t{4}, size_t{5}, packed.size() / 2})
          if (cut <= packed.size())
            EXPECT_FALSE(inflate_zlib(packed.data(), packed.size() - cut, out.data(), plain.size()))
                << what << ", cut by " << cut;
      }
}

TEST(Inflate, RefusesBadHeadersAndChecksums) {
  const Bytes plain(1000, 'x');
  const Bytes good = deflate_with(plain, 6, Z_DEFAULT_STRATEGY);
  Bytes out(plain.size());
  ASSERT_TRUE(inflate_zlib(good.data(), good.size(), out.data(), out.size()));
  auto refused = [&](Bytes bad) { return !inflate_zlib(bad.data(), bad.size(), out.data(), out.size()); };
  Bytes method = good;
  method[0] = 0x79;  // compression method 9
  EXPECT_TRUE(refused(method));
  Bytes check = good;
  check[1] ^= 1;  // header check no longer a multiple of 31
  EXPECT_TRUE(refused(check));
  Bytes dictionary = good;
  dictionary[1] = 0xbb;  // FDICT set (0x78bb is a multiple of 31)
  EXPECT_TRUE(refused(dictionary));
  Bytes checksum = good;
  checksum.back() ^= 1;
  EXPECT_TRUE(refused(checksum));
  EXPECT_FALSE(inflate_zlib(good.data(), 1, out.data(), out.size()));
}

// Bits least significant first, as deflate packs them; Huffman codes go most significant first.
struct BitWriter {
  Bytes bytes{0x78, 0x01};
  int used = 8;
  void put(uint32_t value, int n) {
    for (int i = 0; i < n; ++i) {
      if (used == 8) bytes.push_back(0), used = 0;
      bytes.back() |= static_cast<unsigned char>(((value >> i) & 1) << used++);
    }
  }
  void put_code(uint32_t code, int n) {
    for (int i = n - 1; i >= 0; --i) put(code >> i & 1, 1);
  }
};

TEST(Inflate, RefusesAMatchReachingBeforeTheOutput) {
  // A fixed-Huffman block whose first symbol is a match (length 3, distance 1): nothing to copy.
  BitWriter w;
  w.put(1, 1);           // final block
  w.put(1, 2);           // fixed Huffman
  w.put_code(0x01, 7);   // symbol 257: length 3
  w.put_code(0, 5);      // distance code 0: distance 1
  w.put_code(0x00, 7);   // end of block
  Bytes out(3);
  EXPECT_FALSE(inflate_zlib(w.bytes.data(), w.bytes.size(), out.data(), out.size()));
  // The same match after one literal is valid: "aaaa" (literal 'a' = 0x30 + 0x61, 8 bits).
  BitWriter v;
  v.put(1, 1);
  v.put(1, 2);
  v.put_code(0x30 + 'a', 8);
  v.put_code(0x01, 7);
  v.put_code(0, 5);
  v.put_code(0x00, 7);
  while (v.used != 8) v.put(0, 1);
  const uint32_t adler = static_cast<uint32_t>(adler32(1, reinterpret_cast<const Bytef*>("aaaa"), 4));
  for (int shift = 24; shift >= 0; shift -= 8) v.bytes.push_back(static_cast<unsigned char>(adler >> shift));
  Bytes four(4);
  ASSERT_TRUE(inflate_zlib(v.bytes.data(), v.bytes.size(), four.data(), four.size()));
  EXPECT_EQ(std::string(four.begin(), four.end()), "aaaa");
}

TEST(Inflate, CorruptStreamsAreRefusedWhereZlibRefusesThem) {
  // Random bit flips: whatever we accept, zlib accepts with the same bytes (the checksum makes a
  // silently wrong result all but impossible); nothing reads or writes out of bounds.
  const auto all = inputs();
  const Bytes& plain = all[3].second;  // text: matches of every length and distance
  const Bytes packed = deflate_with(plain, 6, Z_DEFAULT_STRATEGY);
  std::mt19937 rng(11);
  Bytes ours(plain.size()), theirs(plain.size());
  int refused = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    Bytes bad = packed;
    for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips)
      bad[rng() % bad.size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
    const bool accepted = inflate_zlib(bad.data(), bad.size(), ours.data(), ours.size());
    uLongf length = static_cast<uLongf>(theirs.size());
    const bool zlib_accepted = uncompress(theirs.data(), &length, bad.data(), static_cast<uLong>(bad.size())) == Z_OK &&
                               length == theirs.size();
    EXPECT_EQ(accepted, zlib_accepted) << "trial " << trial;
    if (accepted && zlib_accepted) EXPECT_TRUE(ours == theirs) << "trial " << trial;
    refused += !accepted;
  }
  EXPECT_GT(refused, 1900);  // nearly every flip breaks the stream or its checksum
}

}  // namespace
}  // namespace oscar::h5
