// parse_bounded_json against nlohmann's own parser. A document within the limits gives the same value as
// nlohmann::json::parse (and, as ordered_json, the same member order); one beyond them, or not JSON, is a
// JsonParseError with a short message. Checked at the default limits and at small ones that inputs of a few
// bytes reach.
#include <set>
#include <string>
#include <vector>

#include "common/bounded_json.h"
#include "fuzz_target.h"

namespace moeserve::fuzz {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// What the limits count, measured by a SAX pass of nlohmann's parser: nesting, items of each array, distinct
// keys of each object, and every value the text holds (a duplicate key's earlier values too).
class Measure : public nlohmann::json_sax<json> {
 public:
  size_t max_depth = 0, max_items = 0, max_members = 0, values = 0;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool key(string_t& k) override {
    frames_.back().keys.insert(k);
    max_members = std::max(max_members, frames_.back().keys.size());
    return true;
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

  bool within(const JsonLimits& l) const {
    return max_depth <= l.max_depth && max_items <= l.max_array_items &&
           max_members <= l.max_object_members && values <= l.max_values;
  }

 private:
  struct Frame {
    bool is_object = false;
    size_t items = 0;
    std::set<std::string> keys;
  };
  bool open(bool is_object) {
    frames_.emplace_back().is_object = is_object;
    max_depth = std::max(max_depth, frames_.size());
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }
  bool value() {
    ++values;
    if (!frames_.empty() && !frames_.back().is_object)
      max_items = std::max(max_items, ++frames_.back().items);
    return true;
  }
  std::vector<Frame> frames_;
};

// The same text under one set of limits; `measure` is null when nlohmann refuses the text.
void check_at(std::string_view text, const JsonLimits& limits, const Measure* measure, const json* expected) {
  const bool should_parse = measure && measure->within(limits);
  json got;
  try {
    got = parse_bounded_json<json>(text, limits);
  } catch (const JsonParseError& e) {
    check_error_message(e.what());
    FUZZ_CHECK(!should_parse, "refused a document within the limits: {}", e.what());
    FUZZ_CHECK(parse_bounded_json_or_discarded<json>(text, limits).is_discarded(),
               "the _or_discarded form accepted what the throwing one refused");
    return;
  }
  FUZZ_CHECK(should_parse, "accepted a document {}", measure ? "beyond the limits" : "nlohmann refuses");
  FUZZ_CHECK(got == *expected, "a different value than nlohmann's");
  FUZZ_CHECK(parse_bounded_json_or_discarded<json>(text, limits) == got, "the _or_discarded form differs");
  // Member order and the position a duplicate key keeps (its first) as nlohmann's ordered_json has them.
  const ordered_json ordered = parse_bounded_json<ordered_json>(text, limits);
  FUZZ_CHECK(ordered.dump() == ordered_json::parse(text).dump(), "a different ordered_json than nlohmann's");
}

}  // namespace

Verdict fuzz_bounded_json(std::string_view data) {
  Measure measure;
  const bool is_json =
      json::sax_parse(data, &measure, nlohmann::detail::input_format_t::json, /*strict=*/true);
  // nlohmann's DOM parser is iterative for json (std::map members are never copied), so any depth is safe
  // here; the ordered_json reference in check_at only runs within the limits.
  const json expected = is_json ? json::parse(data) : json();
  check_at(data, JsonLimits{}, is_json ? &measure : nullptr, &expected);
  JsonLimits small;
  small.max_depth = 4;
  small.max_array_items = 8;
  small.max_object_members = 8;
  small.max_values = 64;
  check_at(data, small, is_json ? &measure : nullptr, &expected);
  return is_json && measure.within(JsonLimits{}) ? Verdict::kAccepted : Verdict::kRefused;
}

}  // namespace moeserve::fuzz
