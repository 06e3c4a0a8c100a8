#include "common/bounded_json.h"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moeserve {

namespace {

// Builds the document bottom-up from nlohmann's SAX events. Returning false from an event stops the parse;
// `error` then says why.
template <class Json>
class BoundedBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  explicit BoundedBuilder(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return emit(Json(nullptr)); }
  bool boolean(bool v) { return emit(Json(v)); }
  bool number_integer(number_integer_t v) { return emit(Json(v)); }
  bool number_unsigned(number_unsigned_t v) { return emit(Json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return emit(Json(v)); }
  bool string(string_t& v) { return emit(Json(std::move(v))); }
  bool binary(binary_t& v) { return emit(Json::binary(std::move(v))); }

  bool start_object(std::size_t /*elements: unknown in text JSON*/) { return open(true); }
  bool start_array(std::size_t /*elements*/) { return open(false); }

  bool key(string_t& k) {
    Frame& f = frames_.back();
    if (auto found = f.find(k)) {
      f.target = *found;  // a duplicate key: its value is replaced in place, as nlohmann's own parser does
      return true;
    }
    if (f.keys.size() >= limits_.max_object_members) {
      return stop(fmt::format("an object has more than {} members", limits_.max_object_members));
    }
    f.target = f.keys.size();
    f.add_key(std::move(k));
    f.items.emplace_back();
    return true;
  }

  bool end_object() {
    Frame f = std::move(frames_.back());
    frames_.pop_back();
    Json object(Json::value_t::object);
    auto& members = object.template get_ref<typename Json::object_t&>();
    using Object = typename Json::object_t;
    if constexpr (requires { typename Object::Container; }) {  // nlohmann::ordered_map
      // ordered_map is a vector of pairs: reserved once, so no member is ever copied by a reallocation.
      auto& vec = static_cast<typename Object::Container&>(members);
      vec.reserve(f.keys.size());
      for (size_t i = 0; i < f.keys.size(); ++i)
        vec.emplace_back(std::move(f.keys[i]), std::move(f.items[i]));
    } else {
      for (size_t i = 0; i < f.keys.size(); ++i) members.emplace(std::move(f.keys[i]), std::move(f.items[i]));
    }
    return emit(std::move(object));
  }

  bool end_array() {
    Frame f = std::move(frames_.back());
    frames_.pop_back();
    Json array(Json::value_t::array);
    array.template get_ref<typename Json::array_t&>() = std::move(f.items);
    return emit(std::move(array));
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    // nlohmann's message names the position and quotes the last token read, which can be a whole unterminated
    // string: the quote is cut so that an error never echoes a large part of the input.
    constexpr size_t kMaxMessage = 240;
    error_ = e.what();
    if (error_.size() > kMaxMessage) error_ = error_.substr(0, kMaxMessage) + "...'";
    return false;
  }

  Json take_result() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    bool is_object = false;
    std::vector<Json> items;                     // array items, or object values parallel to keys
    std::vector<string_t> keys;                  // objects only
    size_t target = 0;                           // objects: the index the next value goes to
    std::unordered_map<string_t, size_t> index;  // built once an object is past kLinear members

    static constexpr size_t kLinear = 16;

    std::optional<size_t> find(const string_t& k) const {
      if (keys.size() <= kLinear) {
        for (size_t i = 0; i < keys.size(); ++i) {
          if (keys[i] == k) return i;
        }
        return std::nullopt;
      }
      auto it = index.find(k);
      return it == index.end() ? std::nullopt : std::optional<size_t>(it->second);
    }
    void add_key(string_t k) {
      keys.push_back(std::move(k));
      if (keys.size() == kLinear + 1) {
        for (size_t i = 0; i < keys.size(); ++i) index.emplace(keys[i], i);
      } else if (keys.size() > kLinear + 1) {
        index.emplace(keys.back(), keys.size() - 1);
      }
    }
  };

  bool open(bool is_object) {
    if (frames_.size() >= limits_.max_depth) {
      return stop(fmt::format("nests deeper than {} levels", limits_.max_depth));
    }
    frames_.emplace_back();
    frames_.back().is_object = is_object;
    return true;
  }

  bool emit(Json v) {
    if (++values_ > limits_.max_values)
      return stop(fmt::format("has more than {} values", limits_.max_values));
    if (frames_.empty()) {
      root_ = std::move(v);
      return true;
    }
    Frame& f = frames_.back();
    if (f.is_object) {
      f.items[f.target] = std::move(v);
      return true;
    }
    if (f.items.size() >= limits_.max_array_items) {
      return stop(fmt::format("an array has more than {} items", limits_.max_array_items));
    }
    f.items.push_back(std::move(v));
    return true;
  }

  bool stop(std::string why) {
    error_ = "the JSON document " + why;
    return false;
  }

  const JsonLimits& limits_;
  std::vector<Frame> frames_;
  Json root_;
  size_t values_ = 0;
  std::string error_;
};

template <class Json>
bool parse_into(std::string_view text, const JsonLimits& limits, Json& out, std::string& error) {
  BoundedBuilder<Json> builder(limits);
  bool ok = Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                            /*strict=*/true);
  if (!ok) {
    error = builder.error().empty() ? std::string("the JSON document is malformed") : builder.error();
    return false;
  }
  out = builder.take_result();
  return true;
}

}  // namespace

template <class Json>
Json parse_bounded_json(std::string_view text, const JsonLimits& limits) {
  Json out;
  std::string error;
  if (!parse_into(text, limits, out, error)) throw JsonParseError(error);
  return out;
}

template <class Json>
Json parse_bounded_json_or_discarded(std::string_view text, const JsonLimits& limits) {
  Json out;
  std::string error;
  if (!parse_into(text, limits, out, error)) return Json(Json::value_t::discarded);
  return out;
}

template nlohmann::json parse_bounded_json<nlohmann::json>(std::string_view, const JsonLimits&);
template nlohmann::ordered_json parse_bounded_json<nlohmann::ordered_json>(std::string_view,
                                                                           const JsonLimits&);
template nlohmann::json parse_bounded_json_or_discarded<nlohmann::json>(std::string_view, const JsonLimits&);
template nlohmann::ordered_json parse_bounded_json_or_discarded<nlohmann::ordered_json>(std::string_view,
                                                                                        const JsonLimits&);

}  // namespace moeserve
