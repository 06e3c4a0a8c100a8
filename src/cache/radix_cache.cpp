#include "cache/radix_cache.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <set>
#include <tuple>

#include "common/error.h"

namespace moeserve {

namespace {

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return int64_t(i);
}

}  // namespace

RadixCache::RadixCache(PagePool& pages, SlotPool& slots, int page_size)
    : pages_(pages), slots_(slots), page_size_(page_size), root_(std::make_unique<Node>()) {
  check(page_size > 0, "radix cache: page size must be positive, got {}", page_size);
  root_->lock = 1;  // the root is never evicted
}

RadixCache::~RadixCache() {
  // Release every ref the tree holds so that pools shared with other owners stay consistent.
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (int32_t p : n->pages) pages_.unref(p);
    if (n->snapshot >= 0) slots_.free_snapshot(n->snapshot);
    for (auto& [token, child] : n->children) stack.push_back(child.get());
  }
}

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_length) {
  Match m;
  m.node = root_.get();
  std::vector<Node*> path;
  Node* node = root_.get();
  int64_t pos = 0;
  size_t best_depth = 0;  // path[0, best_depth) ends at the hit
  while (pos < int64_t(tokens.size())) {
    auto it = node->children.find(tokens[size_t(pos)]);
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    int64_t common = common_prefix(child->tokens, tokens.subspan(size_t(pos)));
    pos += common;
    if (common < int64_t(child->tokens.size())) break;
    path.push_back(child);
    node = child;
    if (child->snapshot >= 0 && child->end() <= max_length) best_depth = path.size();
  }
  m.kv_length = pos;
  if (best_depth == 0) return m;

  uint64_t now = ++clock_;
  Node* best = path[best_depth - 1];
  m.node = best;
  m.length = best->end();
  m.snapshot = best->snapshot;
  best->snapshot_access = now;
  m.pages.assign(size_t(page_count(m.length)), -1);
  for (size_t d = 0; d < best_depth; ++d) {
    Node* n = path[d];
    n->access = now;
    int64_t first = first_page_index(n->start);
    for (size_t i = 0; i < n->pages.size(); ++i) m.pages[size_t(first) + i] = n->pages[i];
  }
  return m;
}

RadixCache::Peek RadixCache::peek(std::span<const int32_t> tokens, int64_t max_length) const {
  const Node* node = root_.get();
  int64_t pos = 0, best = 0;
  while (pos < int64_t(tokens.size())) {
    auto it = node->children.find(tokens[size_t(pos)]);
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    int64_t common = common_prefix(child->tokens, tokens.subspan(size_t(pos)));
    pos += common;
    if (common < int64_t(child->tokens.size())) break;
    node = child;
    if (child->snapshot >= 0 && child->end() <= max_length) best = child->end();
  }
  return {best, pos};
}

void RadixCache::lock(Node* node) {
  for (Node* n = node; n != nullptr; n = n->parent) ++n->lock;
}

void RadixCache::unlock(Node* node) {
  for (Node* n = node; n != nullptr; n = n->parent) --n->lock;
}

RadixCache::Node* RadixCache::split(Node* node, int64_t upper_len) {
  Node* parent = node->parent;
  auto& slot = parent->children[node->tokens[0]];
  std::unique_ptr<Node> lower = std::move(slot);

  auto upper = std::make_unique<Node>();
  upper->start = lower->start;
  upper->parent = parent;
  upper->lock = lower->lock;
  upper->access = lower->access;
  upper->tokens.assign(lower->tokens.begin(), lower->tokens.begin() + upper_len);

  int64_t mid = lower->start + upper_len;
  int64_t first = first_page_index(lower->start);
  int64_t upper_pages = page_count(mid) - first;       // pages up to the one holding position mid - 1
  int64_t lower_skip = first_page_index(mid) - first;  // the lower part starts in the page holding mid
  upper->pages.assign(lower->pages.begin(), lower->pages.begin() + upper_pages);
  if (lower_skip < upper_pages)
    pages_.ref(lower->pages[size_t(lower_skip)]);  // a boundary page, now listed twice
  lower->pages.erase(lower->pages.begin(), lower->pages.begin() + lower_skip);
  lower->tokens.erase(lower->tokens.begin(), lower->tokens.begin() + upper_len);
  lower->start = mid;
  lower->parent = upper.get();

  Node* result = upper.get();
  int32_t key = lower->tokens[0];
  upper->children.emplace(key, std::move(lower));
  slot = std::move(upper);
  ++nodes_;
  return result;
}

RadixCache::Node* RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> page_table) {
  int64_t n = int64_t(tokens.size());
  check(int64_t(page_table.size()) >= page_count(n), "radix cache: {} tokens need {} pages, got {}", n,
        page_count(n), page_table.size());
  uint64_t now = ++clock_;
  Node* node = root_.get();
  int64_t pos = 0;
  while (pos < n) {
    auto it = node->children.find(tokens[size_t(pos)]);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->start = pos;
      child->parent = node;
      child->access = now;
      child->tokens.assign(tokens.begin() + pos, tokens.end());
      child->pages.assign(page_table.begin() + first_page_index(pos), page_table.begin() + page_count(n));
      for (int32_t p : child->pages) pages_.ref(p);
      Node* result = child.get();
      node->children.emplace(tokens[size_t(pos)], std::move(child));
      ++nodes_;
      return result;
    }
    Node* child = it->second.get();
    int64_t common = common_prefix(child->tokens, tokens.subspan(size_t(pos)));
    if (common < int64_t(child->tokens.size())) child = split(child, common);
    child->access = now;
    pos += common;
    node = child;
  }
  return node;
}

bool RadixCache::set_snapshot(Node* node, int32_t slot) {
  if (node == root_.get() || node->snapshot >= 0) return false;
  node->snapshot = slot;
  node->snapshot_access = ++clock_;
  ++snapshots_;
  return true;
}

int64_t RadixCache::remove_leaf(Node* leaf) {
  int64_t freed = 0;
  for (int32_t p : leaf->pages) freed += pages_.unref(p) ? 1 : 0;
  if (leaf->snapshot >= 0) {
    slots_.free_snapshot(leaf->snapshot);
    --snapshots_;
  }
  int32_t key = leaf->tokens[0];
  leaf->parent->children.erase(key);  // destroys leaf
  --nodes_;
  return freed;
}

int64_t RadixCache::evict_pages(int64_t pages) {
  // Candidates ordered by (has a snapshot, last access): a leaf without a snapshot can never serve a hit.
  using Key = std::tuple<bool, uint64_t, Node*>;
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> heap;
  auto consider = [&](Node* n) {
    if (n != root_.get() && n->children.empty() && n->lock == 0) heap.emplace(n->snapshot >= 0, n->access, n);
  };
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    consider(n);
    for (auto& [token, child] : n->children) stack.push_back(child.get());
  }
  int64_t freed = 0;
  while (freed < pages && !heap.empty()) {
    Node* leaf = std::get<2>(heap.top());
    heap.pop();
    Node* parent = leaf->parent;
    freed += remove_leaf(leaf);
    consider(parent);
  }
  return freed;
}

bool RadixCache::evict_snapshot() {
  Node* oldest = nullptr;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->snapshot >= 0 && (oldest == nullptr || n->snapshot_access < oldest->snapshot_access)) oldest = n;
    for (auto& [token, child] : n->children) stack.push_back(child.get());
  }
  if (oldest == nullptr) return false;
  slots_.free_snapshot(oldest->snapshot);
  oldest->snapshot = -1;
  --snapshots_;
  // Without a snapshot an unlocked leaf's pages can never be used again: remove it and any ancestors it
  // leaves in the same situation.
  Node* n = oldest;
  while (n != root_.get() && n->children.empty() && n->lock == 0 && n->snapshot < 0) {
    Node* parent = n->parent;
    remove_leaf(n);
    n = parent;
  }
  return true;
}

void RadixCache::flush() {
  while (evict_snapshot()) {
  }
  evict_pages(std::numeric_limits<int64_t>::max());
}

void RadixCache::check_invariants() const {
  std::set<int32_t> seen_snapshots;
  int64_t nodes = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    int child_locks = 0;
    for (const auto& [token, child] : n->children) {
      check(!child->tokens.empty() && child->tokens[0] == token,
            "radix cache: child keyed by {} starts with {}", token,
            child->tokens.empty() ? -1 : child->tokens[0]);
      check(child->parent == n, "radix cache: broken parent link");
      check(child->start == n->end(), "radix cache: child starts at {}, parent ends at {}", child->start,
            n->end());
      int64_t want = page_count(child->end()) - first_page_index(child->start);
      check(int64_t(child->pages.size()) == want, "radix cache: node [{}, {}) lists {} pages, expected {}",
            child->start, child->end(), child->pages.size(), want);
      for (int32_t p : child->pages)
        check(p >= 0 && p < pages_.capacity() && pages_.refcount(p) > 0,
              "radix cache: node holds free page {}", p);
      child_locks += child->lock;
      stack.push_back(child.get());
    }
    check(n->lock >= child_locks, "radix cache: node locked {} times, its children {} times", n->lock,
          child_locks);
    check(n->lock >= 0, "radix cache: negative lock count");
    if (n->snapshot >= 0) {
      check(slots_.is_snapshot(n->snapshot), "radix cache: snapshot {} is not a snapshot slot", n->snapshot);
      check(seen_snapshots.insert(n->snapshot).second, "radix cache: snapshot slot {} held twice",
            n->snapshot);
    }
    if (n != root_.get()) ++nodes;
  }
  check(root_->snapshot < 0 && root_->tokens.empty(), "radix cache: the root holds tokens or a snapshot");
  check(nodes == nodes_, "radix cache: counted {} nodes, expected {}", nodes, nodes_);
  check(int64_t(seen_snapshots.size()) == snapshots_, "radix cache: counted {} snapshots, expected {}",
        seen_snapshots.size(), snapshots_);
}

void RadixCache::count_page_refs(std::vector<int32_t>& counts) const {
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (int32_t p : n->pages) ++counts[size_t(p)];
    for (const auto& [token, child] : n->children) stack.push_back(child.get());
  }
}

}  // namespace moeserve
