#pragma once
// The BPE model of tokenizer.json: a vocabulary and ranked merges. Internal to the tokenizer.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moeserve::text {

// Open-addressing map from a token pair to (merge rank, merged id): the hot lookup of BPE.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  void reserve(size_t count);
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  // Returns nullptr when the pair has no merge.
  const Entry* find(int32_t left, int32_t right) const {
    uint64_t key = pack(left, right);
    size_t i = slot(key);
    while (true) {
      const Entry& e = table_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Entry> table_;
  size_t mask_ = 0;
  int shift_ = 64;
};

struct BpeModel {
  static constexpr size_t kSmallWord = 32;  // longer words (runs of CJK characters) merge through a heap
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;  // indexed by id; empty string where the id is unused
  MergeTable merges;
  bool byte_fallback = false;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  int32_t byte_token[256];      // byte-level mode: id of each byte's mapped character, -1 if absent
  int32_t fallback_token[256];  // byte_fallback: id of "<0xXX>", -1 if absent

  // Appends the ids of one pre-tokenized word. In byte-level mode `word` holds raw bytes that map to the
  // vocabulary's byte characters; otherwise it holds UTF-8 characters looked up directly.
  void encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

 private:
  void merge_small(std::vector<int32_t>& symbols) const;
  void merge_large(std::vector<int32_t>& symbols) const;
};

// GPT-2's reversible byte <-> printable character mapping used by the ByteLevel components.
uint32_t byte_to_char(uint8_t byte);
// Returns -1 for characters outside the mapping.
int byte_from_char(uint32_t code_point);

}  // namespace moeserve::text
