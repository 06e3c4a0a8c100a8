#pragma once
// Values of the Jinja interpreter: Python's None/bool/int/float/str/list/dict plus Jinja's Undefined and
// callables. Lists and dicts are shared by reference, as Python objects are (namespace() relies on it).

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::text::jinja {

class Value;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, like a Python dict
  bool is_namespace = false;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* kw(std::string_view name) const;
};

using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // Undefined
  static Value undefined(std::string message) {
    Value v;
    v.str_ = std::move(message);
    return v;
  }
  static Value none() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}
  Value(int i) : kind_(Kind::kInt), int_(i) {}
  Value(double f) : kind_(Kind::kFloat), float_(f) {}
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::kString), str_(s) {}
  Value(List l) : kind_(Kind::kList), list_(std::make_shared<List>(std::move(l))) {}
  Value(std::shared_ptr<Dict> d) : kind_(Kind::kDict), dict_(std::move(d)) {}
  static Value function(std::string name, Function fn) {
    Value v(Kind::kCallable);
    v.str_ = std::move(name);
    v.fn_ = std::make_shared<Function>(std::move(fn));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const {
    return str_;
  }  // also the message of an Undefined, name of a callable
  List& as_list() const { return *list_; }
  Dict& as_dict() const { return *dict_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const Function& as_function() const { return *fn_; }

  bool truthy() const;
  // Python's type name as Jinja's error messages show it: "str object", "list object", "None", ...
  std::string type_repr() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// str(value) as Jinja prints it (Undefined prints as "", None as "None", True as "True", lists as repr).
std::string to_string(const Value& v);
// Python's repr().
std::string repr(const Value& v);
// Python's repr() of a float ("1.0", "1e-05", "inf").
std::string float_repr(double f);
// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) (indent < 0: None).
std::string to_json(const Value& v, int indent = -1, bool sort_keys = false);
// Python ==.
bool equals(const Value& a, const Value& b);

}  // namespace moeserve::text::jinja
