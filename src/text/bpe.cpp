#include "text/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "text/utf8.h"

namespace moeserve::text {

void MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  table_.assign(capacity, Entry{kEmpty, 0, 0});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  uint64_t key = pack(left, right);
  size_t i = slot(key);
  while (table_[i].key != kEmpty) {
    if (table_[i].key == key) return;  // a repeated merge keeps its first (best) rank, like HF
    i = (i + 1) & mask_;
  }
  table_[i] = Entry{key, rank, merged};
}

uint32_t byte_to_char(uint8_t b) {
  // Printable Latin-1 bytes map to themselves; the rest are shifted to U+0100 upwards in byte order.
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
  uint32_t n = 0;
  for (int x = 0; x < b; ++x) {
    bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
    if (!printable) ++n;
  }
  return 256 + n;
}

int byte_from_char(uint32_t cp) {
  static const std::vector<int> table = [] {
    std::vector<int> t(512, -1);
    for (int b = 0; b < 256; ++b) t[byte_to_char(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

void BpeModel::encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges && !byte_level) {
    if (auto it = vocab.find(std::string(word)); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;  // reused: a word allocates nothing
  symbols.clear();
  if (byte_level) {
    if (ignore_merges) {
      std::string mapped;
      for (unsigned char b : word) utf8_append(mapped, byte_to_char(b));
      if (auto it = vocab.find(mapped); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    for (unsigned char b : word) symbols.push_back(byte_token[b]);  // validated at load
  } else {
    size_t i = 0;
    bool last_unk = false;
    while (i < word.size()) {
      size_t n = utf8_sequence_length(word, i);
      if (n == 0) n = 1;
      std::string ch(word.substr(i, n));
      i += n;
      if (auto it = vocab.find(ch); it != vocab.end()) {
        symbols.push_back(it->second);
        last_unk = false;
      } else if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
                   return fallback_token[static_cast<unsigned char>(c)] >= 0;
                 })) {
        for (unsigned char c : ch) symbols.push_back(fallback_token[c]);
        last_unk = false;
      } else if (unk_id >= 0) {
        if (!(fuse_unk && last_unk)) symbols.push_back(unk_id);
        last_unk = true;
      }
    }
  }
  if (symbols.size() <= kSmallWord) {
    merge_small(symbols);
  } else {
    merge_large(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// Quadratic in the word length but with no allocation and few cache misses: the right choice for the
// short and medium words (up to kSmallWord symbols) that make up almost all text.
void BpeModel::merge_small(std::vector<int32_t>& s) const {
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  int32_t rank[kSmallWord];
  int32_t merged[kSmallWord];
  size_t n = s.size();
  auto look = [&](size_t i) {
    const MergeTable::Entry* e = merges.find(s[i], s[i + 1]);
    rank[i] = e ? e->rank : kNone;
    merged[i] = e ? e->merged : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNone) break;
    s[best] = merged[best];
    size_t tail = n - best - 2;  // entries after the removed symbol
    std::memmove(&s[best + 1], &s[best + 2], tail * sizeof(int32_t));
    std::memmove(&rank[best + 1], &rank[best + 2], tail * sizeof(int32_t));
    std::memmove(&merged[best + 1], &merged[best + 2], tail * sizeof(int32_t));
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  s.resize(n);
}

// Heap-driven merging over a linked list: O(n log n), so long words (a run of CJK characters, a megabyte of
// one character) stay cheap. The scratch buffers are per thread so that a word allocates nothing.
void BpeModel::merge_large(std::vector<int32_t>& s) const {
  // Ordered by one 64-bit key, rank then position: lowest rank first, then leftmost, the order tokenizers
  // merges in. left/right detect entries made stale by an earlier merge.
  struct Candidate {
    uint64_t key;
    int32_t left;
    int32_t right;
    bool operator>(const Candidate& o) const { return key > o.key; }
  };
  auto key = [](int32_t rank, int32_t pos) {
    return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos);
  };
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<Candidate> heap;
  size_t n = s.size();
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const auto* e = merges.find(s[pos], s[next[pos]])) {
      heap.push_back({key(e->rank, pos), s[pos], s[next[pos]]});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const auto* e = merges.find(s[i], s[i + 1]))
      heap.push_back({key(e->rank, static_cast<int32_t>(i)), s[i], s[i + 1]});
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  constexpr int32_t kDead = -2;  // prev[] of a symbol merged into its left neighbour
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    Candidate c = heap.back();
    heap.pop_back();
    auto pos = static_cast<int32_t>(c.key & 0xFFFFFFFFu);
    int32_t r = next[pos];
    // Stale entry: one side was merged away or changed since this pair was pushed.
    if (prev[pos] == kDead || r < 0 || s[pos] != c.left || s[r] != c.right) continue;
    s[pos] = merges.find(c.left, c.right)->merged;
    prev[r] = kDead;
    next[pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = pos;
    push(prev[pos]);
    push(pos);
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) s[out++] = s[i];
  s.resize(out);
}

}  // namespace moeserve::text
