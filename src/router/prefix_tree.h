#pragma once
// What one backend has probably cached: a radix tree over the symbol sequences (bytes of the rendered request
// text, or token ids) the router sent it. Like SGLang's router it is approximate — inserted when a request is
// routed, never confirmed by the backend — and bounded: past max_symbols the least recently used leaves go.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace moeserve::router {

class PrefixTree {
 public:
  using Symbol = uint32_t;

  explicit PrefixTree(size_t max_symbols);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // Length of the longest prefix of `key` stored in the tree; touches the matched path (LRU).
  size_t match_prefix(std::span<const Symbol> key);
  // Stores `key` (touching its path), then evicts least recently used leaves until size() <= max_symbols.
  void insert(std::span<const Symbol> key);

  size_t size() const { return size_; }  // symbols stored, the unit of max_symbols
  size_t max_symbols() const { return max_symbols_; }

 private:
  struct Node;
  void evict();

  std::unique_ptr<Node> root_;
  size_t max_symbols_;
  size_t size_ = 0;
  uint64_t clock_ = 0;  // logical time for LRU (one tick per operation), as SGLang's epochs
};

}  // namespace moeserve::router
