#include "router/prefix_tree.h"

#include <gtest/gtest.h>

#include <string>

namespace moeserve::router {
namespace {

std::vector<uint32_t> symbols(const std::string& text) {
  return {text.begin(), text.end()};
}

TEST(PrefixTree, MatchesTheLongestStoredPrefix) {
  PrefixTree tree(1000);
  tree.insert(symbols("user\nhello there\n"));
  EXPECT_EQ(tree.match_prefix(symbols("user\nhello there\nassistant\nhi\n")), 17u);
  EXPECT_EQ(tree.match_prefix(symbols("user\nhello world")), 11u);
  EXPECT_EQ(tree.match_prefix(symbols("system\n")), 0u);
  EXPECT_EQ(tree.size(), 17u);
}

TEST(PrefixTree, SplitsEdgesWithoutLosingEitherBranch) {
  PrefixTree tree(1000);
  tree.insert(symbols("abcdef"));
  tree.insert(symbols("abcxyz"));
  tree.insert(symbols("ab"));
  EXPECT_EQ(tree.match_prefix(symbols("abcdef")), 6u);
  EXPECT_EQ(tree.match_prefix(symbols("abcxyz!")), 6u);
  EXPECT_EQ(tree.match_prefix(symbols("abq")), 2u);
  EXPECT_EQ(tree.size(), 9u);  // "abc" + "def" + "xyz"
  tree.insert(symbols("abcdef"));
  EXPECT_EQ(tree.size(), 9u);
}

TEST(PrefixTree, EvictsLeastRecentlyUsedLeavesToStayBounded) {
  PrefixTree tree(100);
  tree.insert(symbols(std::string(40, 'a')));
  tree.insert(symbols(std::string(40, 'b')));
  tree.match_prefix(symbols(std::string(40, 'a')));  // 'a' is now more recent than 'b'
  tree.insert(symbols(std::string(40, 'c')));        // 120 > 100: the oldest leaf ('b') goes
  EXPECT_LE(tree.size(), 100u);
  EXPECT_EQ(tree.match_prefix(symbols(std::string(40, 'a'))), 40u);
  EXPECT_EQ(tree.match_prefix(symbols(std::string(40, 'b'))), 0u);
  EXPECT_EQ(tree.match_prefix(symbols(std::string(40, 'c'))), 40u);
}

TEST(PrefixTree, NeverExceedsItsBoundUnderManyInserts) {
  PrefixTree tree(5000);
  for (int i = 0; i < 2000; ++i) {
    tree.insert(symbols("system prompt shared by all\nuser " + std::to_string(i * 7919) + " question\n"));
    ASSERT_LE(tree.size(), 5000u);
  }
  // The most recent conversations survive.
  EXPECT_EQ(
      tree.match_prefix(
          symbols("system prompt shared by all\nuser " + std::to_string(1999 * 7919) + " question\n")),
      std::string("system prompt shared by all\nuser " + std::to_string(1999 * 7919) + " question\n").size());
}

}  // namespace
}  // namespace moeserve::router
