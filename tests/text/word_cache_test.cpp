#include "text/word_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moeserve::text {
namespace {

std::vector<int32_t> lookup(const WordCache& cache, std::string_view word, uint64_t hash) {
  std::vector<int32_t> out = {-1};  // found ids are appended after what is there
  if (!cache.append_cached(word, hash, out)) return {};
  return {out.begin() + 1, out.end()};
}

TEST(WordCache, FindsWhatWasInsertedAndNothingElse) {
  WordCache cache;
  std::vector<int32_t> ids = {5, 6, 7};
  cache.insert("hello", WordCache::hash("hello"), ids);
  EXPECT_EQ(lookup(cache, "hello", WordCache::hash("hello")), ids);
  EXPECT_TRUE(lookup(cache, "hellO", WordCache::hash("hellO")).empty());
  EXPECT_TRUE(lookup(cache, "hell", WordCache::hash("hell")).empty());
}

TEST(WordCache, EqualHashesOfDifferentWordsStayApart) {
  WordCache cache;
  std::vector<int32_t> a = {1}, b = {2, 3};
  cache.insert("abc", 77, a);
  cache.insert("abd", 77, b);
  cache.insert("ab", 77, a);
  EXPECT_EQ(lookup(cache, "abc", 77), a);
  EXPECT_EQ(lookup(cache, "abd", 77), b);
  EXPECT_EQ(lookup(cache, "ab", 77), a);
  EXPECT_TRUE(lookup(cache, "abe", 77).empty());
}

TEST(WordCache, EmptiesWhenFullAndKeepsWorking) {
  WordCache cache;
  auto word = [](size_t i) { return "w" + std::to_string(i); };
  size_t n = WordCache::kMaxEntries + 10;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> ids = {static_cast<int32_t>(i), static_cast<int32_t>(i % 7)};
    cache.insert(word(i), WordCache::hash(word(i)), ids);
  }
  EXPECT_TRUE(lookup(cache, word(0), WordCache::hash(word(0))).empty());  // gone with the first fill
  EXPECT_EQ(lookup(cache, word(n - 1), WordCache::hash(word(n - 1))),
            (std::vector<int32_t>{static_cast<int32_t>(n - 1), static_cast<int32_t>((n - 1) % 7)}));
}

TEST(WordCache, SkipsLongWordsAndForgetsOnOwnerChange) {
  WordCache cache;
  std::vector<int32_t> ids = {1};
  std::string long_word(WordCache::kMaxWordBytes + 1, 'x');
  cache.insert(long_word, WordCache::hash(long_word), ids);
  EXPECT_TRUE(lookup(cache, long_word, WordCache::hash(long_word)).empty());
  cache.set_owner(1);
  cache.insert("a", WordCache::hash("a"), ids);
  cache.set_owner(1);
  EXPECT_EQ(lookup(cache, "a", WordCache::hash("a")), ids);
  cache.set_owner(2);
  EXPECT_TRUE(lookup(cache, "a", WordCache::hash("a")).empty());
}

}  // namespace
}  // namespace moeserve::text
