#include "router/prefix_tree.h"

#include <algorithm>
#include <queue>

namespace moeserve::router {

// Invariant: every non-root node has a non-empty edge, and siblings differ in their edge's first symbol.
struct PrefixTree::Node {
  std::vector<Symbol> edge;
  std::vector<std::unique_ptr<Node>> children;
  Node* parent = nullptr;
  uint64_t last_access = 0;

  Node* child(Symbol first) const {
    for (const auto& c : children)
      if (c->edge.front() == first) return c.get();
    return nullptr;
  }
};

PrefixTree::PrefixTree(size_t max_symbols) : root_(std::make_unique<Node>()), max_symbols_(max_symbols) {}
PrefixTree::~PrefixTree() = default;

size_t PrefixTree::match_prefix(std::span<const Symbol> key) {
  uint64_t now = ++clock_;
  Node* node = root_.get();
  size_t matched = 0;
  while (matched < key.size()) {
    Node* next = node->child(key[matched]);
    if (next == nullptr) break;
    auto rest = key.subspan(matched);
    size_t common = std::mismatch(next->edge.begin(), next->edge.end(), rest.begin(), rest.end()).first -
                    next->edge.begin();
    next->last_access = now;
    matched += common;
    if (common < next->edge.size()) break;
    node = next;
  }
  return matched;
}

void PrefixTree::insert(std::span<const Symbol> key) {
  uint64_t now = ++clock_;
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < key.size()) {
    Node* next = node->child(key[pos]);
    auto rest = key.subspan(pos);
    if (next == nullptr) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(rest.begin(), rest.end());
      leaf->parent = node;
      leaf->last_access = now;
      size_ += rest.size();
      node->children.push_back(std::move(leaf));
      break;
    }
    size_t common = std::mismatch(next->edge.begin(), next->edge.end(), rest.begin(), rest.end()).first -
                    next->edge.begin();
    if (common < next->edge.size()) {
      // Split `next` so that its first `common` symbols become their own node.
      auto upper = std::make_unique<Node>();
      upper->edge.assign(next->edge.begin(), next->edge.begin() + common);
      upper->parent = node;
      auto& slot = *std::find_if(node->children.begin(), node->children.end(),
                                 [&](const auto& c) { return c.get() == next; });
      std::unique_ptr<Node> lower = std::move(slot);
      lower->edge.erase(lower->edge.begin(), lower->edge.begin() + common);
      lower->parent = upper.get();
      upper->last_access = lower->last_access;
      upper->children.push_back(std::move(lower));
      slot = std::move(upper);
      next = slot.get();
    }
    next->last_access = now;
    pos += common;
    node = next;
  }
  if (size_ > max_symbols_) evict();
}

void PrefixTree::evict() {
  auto older = [](const Node* a, const Node* b) { return a->last_access > b->last_access; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(older)> leaves(older);
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (node->children.empty() && node != root_.get()) leaves.push(node);
    for (const auto& c : node->children) stack.push_back(c.get());
  }
  // Evict below the bound (to 90%) so a tree at its limit does not rescan on every insert.
  size_t target = max_symbols_ - max_symbols_ / 10;
  while (size_ > target && !leaves.empty()) {
    Node* leaf = leaves.top();
    leaves.pop();
    Node* parent = leaf->parent;
    size_ -= leaf->edge.size();
    std::erase_if(parent->children, [&](const auto& c) { return c.get() == leaf; });
    if (parent->children.empty() && parent != root_.get()) leaves.push(parent);
  }
}

}  // namespace moeserve::router
