#include "text/jinja.h"

#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <unordered_map>
#include <utility>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"
#include "text/utf8.h"

namespace moeserve::text::jinja {

namespace {

[[noreturn]] void raise(const std::string& kind, const std::string& message) {
  throw TemplateError(kind, message);
}

// ================================================================================================
// AST
// ================================================================================================

struct Frame;
class Interpreter;

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Interpreter& in) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

enum class Flow { kNormal, kBreak, kContinue };

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual Flow exec(Interpreter& in, std::string& out) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct CallArgs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

// ================================================================================================
// Interpreter state
// ================================================================================================

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

Flow exec_body(Interpreter& in, const Body& body, std::string& out);

class Interpreter {
 public:
  std::shared_ptr<Frame> frame;
  int depth = 0;  // macro recursion guard

  Value lookup(const std::string& name) const {
    if (const Value* v = frame->lookup(name)) return *v;
    return Value::undefined("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) { frame->vars[name] = std::move(v); }

  // Runs fn with a new scope whose parent is `parent` (the current frame by default).
  template <typename Fn>
  auto scoped(std::shared_ptr<Frame> parent, Fn fn) {
    auto saved = frame;
    auto f = std::make_shared<Frame>();
    f->parent = std::move(parent);
    frame = f;
    struct Restore {
      Interpreter* in;
      std::shared_ptr<Frame> saved;
      ~Restore() { in->frame = saved; }
    } restore{this, saved};
    return fn();
  }
};

// ================================================================================================
// Helpers with Python semantics
// ================================================================================================

[[noreturn]] void undefined_error(const Value& v) {
  raise("UndefinedError", v.as_string());
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> cps;
  size_t i = 0;
  while (i < s.size()) {
    if (utf8_sequence_length(s, i) == 0) {
      cps.push_back(0xFFFD);
      ++i;
    } else {
      cps.push_back(utf8_decode(s, i));
    }
  }
  return cps;
}

std::string from_code_points(const std::vector<uint32_t>& cps) {
  std::string s;
  for (uint32_t c : cps) utf8_append(s, c);
  return s;
}

size_t string_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return static_cast<int64_t>(string_length(v.as_string()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().items.size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      raise("TypeError", "object of type '" + v.type_repr() + "' has no len()");
  }
}

// Iterating a value as Python does: list items, dict keys, string characters; Undefined is empty.
List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& kv : v.as_dict().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (uint32_t c : code_points(v.as_string())) {
        std::string s;
        utf8_append(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    case Value::Kind::kUndefined:
      return {};
    default:
      raise("TypeError", "'" + v.type_repr() + "' is not iterable");
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_float(), y = b.as_float();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  raise("TypeError", std::string("'") + op + "' not supported between instances of '" + a.type_repr() +
                         "' and '" + b.type_repr() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string())
        raise("TypeError", "'in <string>' requires string as left operand, not " + item.type_repr());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list())
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      raise("TypeError", "argument of type '" + container.type_repr() + "' is not iterable");
  }
}

// Python index normalization; returns false when out of range.
bool normalize_index(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && static_cast<size_t>(i) < size;
}

template <typename T>
std::vector<T> python_slice(const std::vector<T>& seq, const Value& start, const Value& stop,
                            const Value& step_v) {
  int64_t n = static_cast<int64_t>(seq.size());
  int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : step_v.as_int();
  if (step == 0) raise("ValueError", "slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = bound(start, step > 0 ? 0 : n - 1);
  int64_t e = bound(stop, step > 0 ? n : -1);
  std::vector<T> out;
  if (step > 0) {
    for (int64_t i = b; i < e; i += step) out.push_back(seq[static_cast<size_t>(i)]);
  } else {
    for (int64_t i = b; i > e; i += step) out.push_back(seq[static_cast<size_t>(i)]);
  }
  return out;
}

std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> cps = code_points(s);
  std::vector<uint32_t> set;
  bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = code_points(chars.as_string());
  auto strip_it = [&](uint32_t c) {
    if (whitespace)
      return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x1F ||
             c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
             c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(std::vector<uint32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b),
                                                cps.begin() + static_cast<std::ptrdiff_t>(e)));
}

List split_string(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {  // split on runs of whitespace, dropping empty pieces
    std::string cur;
    bool in_word = false;
    size_t i = 0;
    while (i < s.size()) {
      char c = s[i];
      bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
      if (ws && (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit)) {
        if (in_word) out.emplace_back(cur), cur.clear(), in_word = false;
        ++i;
      } else {
        if (!in_word && ws) {
          ++i;
          continue;
        }
        in_word = true;
        cur += c;
        ++i;
      }
    }
    if (in_word) out.emplace_back(cur);
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty()) raise("ValueError", "empty separator");
  size_t pos = 0;
  while (true) {
    size_t at = s.find(d, pos);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit)) break;
    out.emplace_back(s.substr(pos, at - pos));
    pos = at + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between characters (and at both ends).
    std::string out = to;
    int64_t done = 1;
    for (uint32_t c : code_points(s)) {
      utf8_append(out, c);
      if (count < 0 || done < count) out += to, ++done;
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++done;
  }
  out.append(s, pos);
  return out;
}

std::string case_map(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::string out;
  bool prev_cased = false;
  bool first = true;
  for (uint32_t c : code_points(s)) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    utf8proc_int32_t r = cp;
    if (mode == 0 || (mode == 3 && !first) || (mode == 2 && prev_cased)) {
      r = utf8proc_tolower(cp);
    } else if (mode == 1 || mode == 3 || mode == 2) {
      r = mode == 1 ? utf8proc_toupper(cp) : utf8proc_totitle(cp);
    }
    auto cat = utf8proc_category(cp);
    prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
    first = false;
    utf8_append(out, static_cast<uint32_t>(r));
  }
  return out;
}

const Value& arg(Args& a, size_t index, const char* name, const Value& fallback) {
  if (index < a.positional.size()) return a.positional[index];
  if (const Value* v = a.kw(name)) return *v;
  return fallback;
}
// With a temporary fallback (`arg(a, 1, "maxsplit", Value(-1))`) the result is a copy: a reference to the
// fallback would dangle once the caller's full expression ends, and `const Value& m = arg(...)` keeps a
// returned value alive where it cannot keep the temporary argument.
Value arg(Args& a, size_t index, const char* name, Value&& fallback) {
  const Value& v = arg(a, index, name, std::as_const(fallback));
  return &v == &fallback ? std::move(fallback) : v;
}

const Value kNoneValue = Value::none();
const Value kUndefinedValue = Value();

Value bind_method(const Value& self, const std::string& name);

// obj.name as Jinja resolves it: Python attribute first (methods), then item.
Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    const Dict& d = obj.as_dict();
    if (!d.is_namespace && (name == "get" || name == "items" || name == "keys" || name == "values"))
      return bind_method(obj, name);
    if (const Value* v = d.find(name)) return *v;
  } else if (obj.is_string() || obj.is_list()) {
    Value m = bind_method(obj, name);
    if (!m.is_undefined()) return m;
  }
  return Value::undefined("'" + obj.type_repr() + "' has no attribute '" + name + "'");
}

// obj[key] as Jinja resolves it: item first, then attribute for string keys.
Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
    return get_attr(obj, key.as_string());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      if (normalize_index(i, obj.as_list().size())) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      auto cps = code_points(obj.as_string());
      if (normalize_index(i, cps.size())) return Value(from_code_points({cps[static_cast<size_t>(i)]}));
    }
    return Value::undefined("'" + obj.type_repr() + "' has no element " + std::to_string(key.as_int()));
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined("'" + obj.type_repr() + "' has no element " + repr(key));
}

Value bind_method(const Value& self, const std::string& name) {
  auto method = [&](Function fn) { return Value::function(name, std::move(fn)); };
  if (self.is_string()) {
    const std::string s = self.as_string();
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return method([s, starts](Args& a) {
        const Value& p = arg(a, 0, "prefix", kUndefinedValue);
        List options = p.is_list() ? p.as_list() : List{p};
        for (const Value& o : options) {
          if (!o.is_string())
            raise("TypeError", "startswith/endswith argument must be str or a tuple of str");
          const std::string& x = o.as_string();
          if (starts ? s.starts_with(x) : s.ends_with(x)) return Value(true);
        }
        return Value(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool l = name != "rstrip", r = name != "lstrip";
      return method(
          [s, l, r](Args& a) { return Value(strip_chars(s, arg(a, 0, "chars", kNoneValue), l, r)); });
    }
    if (name == "split")
      return method([s](Args& a) {
        const Value& m = arg(a, 1, "maxsplit", Value(-1));
        return Value(split_string(s, arg(a, 0, "sep", kNoneValue), m.as_int()));
      });
    if (name == "splitlines")
      return method([s](Args&) {
        List out = split_string(s, Value("\n"), -1);
        if (!out.empty() && out.back().as_string().empty()) out.pop_back();
        return Value(std::move(out));
      });
    if (name == "upper") return method([s](Args&) { return Value(case_map(s, 1)); });
    if (name == "lower") return method([s](Args&) { return Value(case_map(s, 0)); });
    if (name == "title") return method([s](Args&) { return Value(case_map(s, 2)); });
    if (name == "capitalize") return method([s](Args&) { return Value(case_map(s, 3)); });
    if (name == "replace")
      return method([s](Args& a) {
        return Value(replace_all(s, arg(a, 0, "old", Value("")).as_string(),
                                 arg(a, 1, "new", Value("")).as_string(),
                                 arg(a, 2, "count", Value(-1)).as_int()));
      });
    if (name == "find")
      return method([s](Args& a) {
        size_t at = s.find(arg(a, 0, "sub", Value("")).as_string());
        return Value(at == std::string::npos ? int64_t{-1}
                                             : static_cast<int64_t>(string_length(s.substr(0, at))));
      });
    if (name == "count")
      return method([s](Args& a) {
        const std::string sub = arg(a, 0, "sub", Value("")).as_string();
        if (sub.empty()) return Value(static_cast<int64_t>(string_length(s) + 1));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value(n);
      });
    if (name == "join")
      return method([s](Args& a) {
        std::string out;
        bool first = true;
        for (const Value& v : iterate(arg(a, 0, "iterable", kUndefinedValue))) {
          if (!first) out += s;
          out += to_string(v);
          first = false;
        }
        return Value(out);
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
      return method([s, name](Args&) {
        if (s.empty()) return Value(false);
        for (unsigned char c : s) {
          bool ok = name == "isdigit"   ? std::isdigit(c) != 0
                    : name == "isalpha" ? std::isalpha(c) != 0
                    : name == "isspace" ? std::isspace(c) != 0
                                        : std::isalnum(c) != 0;
          if (!ok) return Value(false);
        }
        return Value(true);
      });
    }
    return Value();
  }
  if (self.is_dict()) {
    auto d = self.dict_ptr();
    if (name == "get")
      return method([d](Args& a) {
        const Value& key = arg(a, 0, "key", kUndefinedValue);
        if (key.is_string())
          if (const Value* v = d->find(key.as_string())) return *v;
        return arg(a, 1, "default", kNoneValue);
      });
    if (name == "items")
      return method([d](Args&) {
        List out;
        for (const auto& [k, v] : d->items) out.emplace_back(List{Value(k), v});
        return Value(std::move(out));
      });
    if (name == "keys")
      return method([d](Args&) {
        List out;
        for (const auto& kv : d->items) out.emplace_back(kv.first);
        return Value(std::move(out));
      });
    if (name == "values")
      return method([d](Args&) {
        List out;
        for (const auto& kv : d->items) out.push_back(kv.second);
        return Value(std::move(out));
      });
  }
  if (self.is_list()) {
    List l = self.as_list();
    if (name == "index")
      return method([l](Args& a) {
        const Value& x = arg(a, 0, "value", kUndefinedValue);
        for (size_t i = 0; i < l.size(); ++i)
          if (equals(l[i], x)) return Value(static_cast<int64_t>(i));
        raise("ValueError", repr(x) + " is not in list");
      });
    if (name == "count")
      return method([l](Args& a) {
        const Value& x = arg(a, 0, "value", kUndefinedValue);
        return Value(static_cast<int64_t>(
            std::count_if(l.begin(), l.end(), [&](const Value& v) { return equals(v, x); })));
      });
  }
  return Value();
}

// ================================================================================================
// Tests and filters
// ================================================================================================

bool run_test(const std::string& name, const Value& v, Args& a) {
  auto other = [&]() -> const Value& { return arg(a, 0, "other", kUndefinedValue); };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict() && !v.as_dict().is_namespace;
  // Jinja's Undefined is iterable and has __len__/__getitem__, so it passes these two.
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence")
    return v.is_string() || v.is_list() || (v.is_dict() && !v.as_dict().is_namespace) || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) raise("TypeError", "'" + name + "' test needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t n = arg(a, 0, "num", Value(1)).as_int();
    if (n == 0) raise("ZeroDivisionError", "integer division or modulo by zero");
    return v.as_int() % n == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other(), "<") < 0;
  if (name == "le" || name == "<=") return compare(v, other(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other(), ">") > 0;
  if (name == "ge" || name == ">=") return compare(v, other(), ">=") >= 0;
  if (name == "in") return contains(arg(a, 0, "seq", kUndefinedValue), v);
  if (name == "sameas") {
    const Value& o = other();
    if (v.is_dict() && o.is_dict()) return v.dict_ptr() == o.dict_ptr();
    if (v.is_list() || o.is_list()) return false;
    return v.kind() == o.kind() && equals(v, o);
  }
  if (name == "lower") return v.is_string() && case_map(v.as_string(), 0) == v.as_string();
  if (name == "upper") return v.is_string() && case_map(v.as_string(), 1) == v.as_string();
  if (name == "escaped") return false;
  raise("TemplateAssertionError", "No test named '" + name + "'.");
}

bool is_known_test(const std::string& name) {
  static const char* kTests[] = {"defined",  "undefined", "none", "string", "number",      "integer",
                                 "float",    "boolean",   "true", "false",  "mapping",     "iterable",
                                 "sequence", "callable",  "odd",  "even",   "divisibleby", "eq",
                                 "equalto",  "==",        "ne",   "!=",     "lt",          "lessthan",
                                 "<",        "le",        "<=",   "gt",     "greaterthan", ">",
                                 "ge",       ">=",        "in",   "sameas", "lower",       "upper",
                                 "escaped"};
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos || cur.is_undefined()) return cur;
    pos = dot + 1;
  }
}

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, Args& a);

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// printf-style formatting for the `format` filter and `%` on strings (%s, %d, %i, %f, %r, %%).
std::string percent_format(const std::string& fmt, const List& values) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '%') {
      out += '%';
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < fmt.size() && std::strchr("0123456789.-+ #", fmt[j])) ++j;
    if (j >= fmt.size()) raise("ValueError", "incomplete format");
    if (next >= values.size()) raise("TypeError", "not enough arguments for format string");
    const Value& v = values[next++];
    std::string spec = fmt.substr(i, j - i + 1);
    char conv = fmt[j];
    char buf[128];
    if (conv == 's') {
      out += to_string(v);
    } else if (conv == 'r') {
      out += repr(v);
    } else if (conv == 'd' || conv == 'i') {
      spec.back() = 'd';
      std::snprintf(buf, sizeof(buf), (spec.substr(0, spec.size() - 1) + "lld").c_str(),
                    static_cast<long long>(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.as_int()));
      out += buf;
    } else if (conv == 'f' || conv == 'e' || conv == 'g') {
      std::snprintf(buf, sizeof(buf), spec.c_str(), v.as_float());
      out += buf;
    } else {
      raise("ValueError", std::string("unsupported format character '") + conv + "'");
    }
    i = j;
  }
  return out;
}

// The filters, one function each, found by name in one table (filters that share a body get its names).
// Each takes the interpreter (for filters that apply filters), the name it was called by, the value and the
// call's arguments.
using FilterFn = Value (*)(Interpreter& in, const std::string& name, const Value& v, Args& a);

// A filter's string operand: an undefined value is the empty string, as in Jinja2.
std::string filter_text(const Value& x) {
  if (x.is_undefined()) return "";
  return to_string(x);
}

Value filter_safe_or_string(Interpreter&, const std::string& name, const Value& v, Args&) {
  return name == "safe" && !v.is_string() ? v : Value(to_string(v));
}

Value filter_tojson(Interpreter&, const std::string&, const Value& v, Args& a) {
  const Value& indent = arg(a, 0, "indent", kNoneValue);
  return Value(to_json(v, indent.is_none() || indent.is_undefined() ? -1 : static_cast<int>(indent.as_int()),
                       arg(a, 1, "sort_keys", Value(false)).truthy()));
}

Value filter_trim(Interpreter&, const std::string&, const Value& v, Args& a) {
  return Value(strip_chars(filter_text(v), arg(a, 0, "chars", kNoneValue), true, true));
}

Value filter_length(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(length_of(v));
}

Value filter_lower(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(case_map(filter_text(v), 0));
}

Value filter_upper(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(case_map(filter_text(v), 1));
}

Value filter_title(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(case_map(filter_text(v), 2));
}

Value filter_capitalize(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(case_map(filter_text(v), 3));
}

Value filter_escape(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(html_escape(filter_text(v)));
}

Value filter_replace(Interpreter&, const std::string&, const Value& v, Args& a) {
  return Value(replace_all(filter_text(v), to_string(arg(a, 0, "old", Value(""))),
                           to_string(arg(a, 1, "new", Value(""))), arg(a, 2, "count", Value(-1)).as_int()));
}

Value filter_default(Interpreter&, const std::string&, const Value& v, Args& a) {
  bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
  return v;
}

Value filter_items(Interpreter&, const std::string&, const Value& v, Args&) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) raise("TypeError", "Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.as_dict().items) out.emplace_back(List{Value(k), x});
  return Value(std::move(out));
}

Value filter_list(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(iterate(v));
}

Value filter_first_or_last(Interpreter&, const std::string& name, const Value& v, Args&) {
  List l = iterate(v);
  if (l.empty()) return Value::undefined("No first item, sequence was empty.");
  return name == "first" ? l.front() : l.back();
}

Value filter_reverse(Interpreter&, const std::string&, const Value& v, Args&) {
  if (v.is_string()) {
    auto cps = code_points(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(from_code_points(cps));
  }
  List l = iterate(v);
  std::reverse(l.begin(), l.end());
  return Value(std::move(l));
}

Value filter_join(Interpreter&, const std::string&, const Value& v, Args& a) {
  const Value& attribute = arg(a, 1, "attribute", kNoneValue);
  std::string sep = to_string(arg(a, 0, "d", Value("")));
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    if (!first) out += sep;
    out += to_string(attribute.is_none() ? x : attribute_path(x, to_string(attribute)));
    first = false;
  }
  return Value(out);
}

Value filter_map(Interpreter& in, const std::string&, const Value& v, Args& a) {
  List out;
  if (const Value* attribute = a.kw("attribute")) {
    const Value* dflt = a.kw("default");
    for (const Value& x : iterate(v)) {
      Value r = attribute_path(x, to_string(*attribute));
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty()) raise("FilterArgumentError", "map requires a filter argument");
  std::string filter = to_string(a.positional[0]);
  Args rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& x : iterate(v)) out.push_back(apply_filter(in, filter, x, rest));
  return Value(std::move(out));
}

Value filter_select_or_reject(Interpreter&, const std::string& name, const Value& v, Args& a) {
  bool by_attr = name.ends_with("attr");
  bool keep_when = name.starts_with("select");
  size_t first_arg = by_attr ? 1 : 0;
  std::string attr = by_attr ? to_string(arg(a, 0, "attribute", Value(""))) : "";
  std::string test = a.positional.size() > first_arg ? to_string(a.positional[first_arg]) : "";
  Args targs;
  if (a.positional.size() > first_arg + 1)
    targs.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(first_arg) + 1,
                            a.positional.end());
  List out;
  for (const Value& x : iterate(v)) {
    Value subject = by_attr ? attribute_path(x, attr) : x;
    bool ok = test.empty() ? subject.truthy() : run_test(test, subject, targs);
    if (ok == keep_when) out.push_back(x);
  }
  return Value(std::move(out));
}

Value filter_unique(Interpreter&, const std::string&, const Value& v, Args&) {
  List out;
  for (const Value& x : iterate(v))
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equals(x, y); })) out.push_back(x);
  return Value(std::move(out));
}

Value filter_sort_or_dictsort(Interpreter&, const std::string& name, const Value& v, Args& a) {
  bool reverse = arg(a, name == "sort" ? 0 : 2, "reverse", Value(false)).truthy();
  const Value& attribute = name == "sort" ? arg(a, 2, "attribute", kNoneValue) : kNoneValue;
  List l;
  if (name == "dictsort") {
    if (!v.is_dict()) raise("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
    for (const auto& [k, x] : v.as_dict().items) l.emplace_back(List{Value(k), x});
  } else {
    l = iterate(v);
  }
  bool by_value = name == "dictsort" && to_string(arg(a, 1, "by", Value("key"))) == "value";
  auto key = [&](const Value& x) {
    if (name == "dictsort") return x.as_list()[by_value ? 1 : 0];
    return attribute.is_none() ? x : attribute_path(x, to_string(attribute));
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    Value kx = key(x), ky = key(y);
    if (kx.is_string() && ky.is_string()) {  // case-insensitive by default
      kx = Value(case_map(kx.as_string(), 0));
      ky = Value(case_map(ky.as_string(), 0));
    }
    return reverse ? compare(ky, kx, "<") < 0 : compare(kx, ky, "<") < 0;
  });
  return Value(std::move(l));
}

Value filter_int(Interpreter&, const std::string&, const Value& v, Args& a) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return Value(static_cast<int64_t>(v.as_float()));
  if (v.is_string()) {
    try {
      size_t used = 0;
      std::string s = strip_chars(v.as_string(), kNoneValue, true, true);
      int64_t r = std::stoll(s, &used, 10);
      if (used == s.size()) return Value(r);
      return Value(static_cast<int64_t>(std::stod(s)));
    } catch (const std::exception&) {
    }
  }
  return arg(a, 0, "default", Value(0));
}

Value filter_float(Interpreter&, const std::string&, const Value& v, Args& a) {
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    try {
      return Value(std::stod(v.as_string()));
    } catch (const std::exception&) {
    }
  }
  return arg(a, 0, "default", Value(0.0));
}

Value filter_abs(Interpreter&, const std::string&, const Value& v, Args&) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

Value filter_round(Interpreter&, const std::string&, const Value& v, Args& a) {
  int64_t precision = arg(a, 0, "precision", Value(0)).as_int();
  std::string method = to_string(arg(a, 1, "method", Value("common")));
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  x = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
  return Value(x / scale);
}

Value filter_sum(Interpreter&, const std::string&, const Value& v, Args& a) {
  const Value& attribute = arg(a, 0, "attribute", kNoneValue);
  Value total = arg(a, 1, "start", Value(0));
  for (const Value& x : iterate(v)) {
    Value item = attribute.is_none() ? x : attribute_path(x, to_string(attribute));
    total = total.is_int() && item.is_int() ? Value(total.as_int() + item.as_int())
                                            : Value(total.as_float() + item.as_float());
  }
  return total;
}

Value filter_min_or_max(Interpreter&, const std::string& name, const Value& v, Args& a) {
  List l = iterate(v);
  if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value& attribute = arg(a, 1, "attribute", kNoneValue);
  auto key = [&](const Value& x) {
    return attribute.is_none() ? x : attribute_path(x, to_string(attribute));
  };
  Value best = l[0];
  for (const Value& x : l) {
    int c = compare(key(x), key(best), "<");
    if (name == "min" ? c < 0 : c > 0) best = x;
  }
  return best;
}

Value filter_wordcount(Interpreter&, const std::string&, const Value& v, Args&) {
  return Value(static_cast<int64_t>(split_string(filter_text(v), kNoneValue, -1).size()));
}

Value filter_indent(Interpreter&, const std::string&, const Value& v, Args& a) {
  const Value& width_v = arg(a, 0, "width", Value(4));
  std::string pad =
      width_v.is_string() ? width_v.as_string() : std::string(static_cast<size_t>(width_v.as_int()), ' ');
  bool first = arg(a, 1, "first", Value(false)).truthy();
  bool blank = arg(a, 2, "blank", Value(false)).truthy();
  std::string s = filter_text(v), out;
  List lines = split_string(s, Value("\n"), -1);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) out += '\n';
    if ((i > 0 || first) && (blank || !line.empty())) out += pad;
    out += line;
  }
  return Value(out);
}

Value filter_format(Interpreter&, const std::string&, const Value& v, Args& a) {
  List values = a.positional;
  return Value(percent_format(filter_text(v), values));
}

Value filter_attr(Interpreter&, const std::string&, const Value& v, Args& a) {
  return get_attr(v, to_string(arg(a, 0, "name", Value(""))));
}

Value filter_batch(Interpreter&, const std::string&, const Value& v, Args& a) {
  int64_t size = arg(a, 0, "linecount", Value(1)).as_int();
  if (size <= 0) raise("FilterArgumentError", "batch size must be positive");
  List out, cur;
  for (const Value& x : iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == size) out.emplace_back(std::move(cur)), cur.clear();
  }
  if (!cur.empty()) {
    if (const Value* fill = a.positional.size() > 1 ? &a.positional[1] : a.kw("fill_with"))
      while (static_cast<int64_t>(cur.size()) < size) cur.push_back(*fill);
    out.emplace_back(std::move(cur));
  }
  return Value(std::move(out));
}

const FilterFn* find_filter(const std::string& name) {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"safe", filter_safe_or_string},
      {"string", filter_safe_or_string},
      {"tojson", filter_tojson},
      {"trim", filter_trim},
      {"length", filter_length},
      {"count", filter_length},
      {"lower", filter_lower},
      {"upper", filter_upper},
      {"title", filter_title},
      {"capitalize", filter_capitalize},
      {"escape", filter_escape},
      {"e", filter_escape},
      {"replace", filter_replace},
      {"default", filter_default},
      {"d", filter_default},
      {"items", filter_items},
      {"list", filter_list},
      {"first", filter_first_or_last},
      {"last", filter_first_or_last},
      {"reverse", filter_reverse},
      {"join", filter_join},
      {"map", filter_map},
      {"select", filter_select_or_reject},
      {"reject", filter_select_or_reject},
      {"selectattr", filter_select_or_reject},
      {"rejectattr", filter_select_or_reject},
      {"unique", filter_unique},
      {"sort", filter_sort_or_dictsort},
      {"dictsort", filter_sort_or_dictsort},
      {"int", filter_int},
      {"float", filter_float},
      {"abs", filter_abs},
      {"round", filter_round},
      {"sum", filter_sum},
      {"min", filter_min_or_max},
      {"max", filter_min_or_max},
      {"wordcount", filter_wordcount},
      {"indent", filter_indent},
      {"format", filter_format},
      {"attr", filter_attr},
      {"batch", filter_batch},
  };
  auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : &it->second;
}

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, Args& a) {
  if (const FilterFn* filter = find_filter(name)) return (*filter)(in, name, v, a);
  raise("TemplateAssertionError", "No filter named '" + name + "'.");
}

bool is_known_filter(const std::string& name) {
  return find_filter(name) != nullptr;
}

// ================================================================================================
// Expression nodes
// ================================================================================================

Args eval_args(Interpreter& in, const CallArgs& args) {
  Args a;
  for (const auto& e : args.positional) a.positional.push_back(e->eval(in));
  for (const auto& [k, e] : args.keyword) a.keyword.emplace_back(k, e->eval(in));
  return a;
}

struct Literal : Expr {
  Value value;
  Value eval(Interpreter&) const override { return value; }
};

struct Name : Expr {
  std::string name;
  Value eval(Interpreter& in) const override { return in.lookup(name); }
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value eval(Interpreter& in) const override {
    List l;
    for (const auto& e : items) l.push_back(e->eval(in));
    return Value(std::move(l));
  }
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Interpreter& in) const override {
    auto d = std::make_shared<Dict>();
    for (const auto& [k, v] : items) {
      Value key = k->eval(in);
      d->set(key.is_string() ? key.as_string() : to_string(key), v->eval(in));
    }
    return Value(std::move(d));
  }
};

struct GetAttr : Expr {
  ExprPtr obj;
  std::string name;
  Value eval(Interpreter& in) const override { return get_attr(obj->eval(in), name); }
};

struct GetItem : Expr {
  ExprPtr obj, key;
  Value eval(Interpreter& in) const override { return get_item(obj->eval(in), key->eval(in)); }
};

struct SliceExpr : Expr {
  ExprPtr obj, start, stop, step;
  Value eval(Interpreter& in) const override {
    Value o = obj->eval(in);
    auto part = [&](const ExprPtr& e) { return e ? e->eval(in) : Value::none(); };
    Value b = part(start), e = part(stop), s = part(step);
    if (o.is_list()) return Value(python_slice(o.as_list(), b, e, s));
    if (o.is_string()) return Value(from_code_points(python_slice(code_points(o.as_string()), b, e, s)));
    if (o.is_undefined()) undefined_error(o);
    raise("TypeError", "'" + o.type_repr() + "' is not subscriptable");
  }
};

struct Call : Expr {
  ExprPtr callee;
  CallArgs args;
  Value eval(Interpreter& in) const override {
    Value f = callee->eval(in);
    if (f.is_undefined()) undefined_error(f);
    if (!f.is_callable()) raise("TypeError", "'" + f.type_repr() + "' is not callable");
    Args a = eval_args(in, args);
    return f.as_function()(a);
  }
};

struct FilterExpr : Expr {
  ExprPtr subject;
  std::string name;
  CallArgs args;
  Value eval(Interpreter& in) const override {
    Value v = subject->eval(in);
    Args a = eval_args(in, args);
    return apply_filter(in, name, v, a);
  }
};

struct TestExpr : Expr {
  ExprPtr subject;
  std::string name;
  CallArgs args;
  bool negated = false;
  Value eval(Interpreter& in) const override {
    Value v = subject->eval(in);
    Args a = eval_args(in, args);
    return Value(run_test(name, v, a) != negated);
  }
};

struct Not : Expr {
  ExprPtr operand;
  Value eval(Interpreter& in) const override { return Value(!operand->eval(in).truthy()); }
};

struct Negate : Expr {
  ExprPtr operand;
  bool minus = true;
  Value eval(Interpreter& in) const override {
    Value v = operand->eval(in);
    if (v.is_undefined()) undefined_error(v);
    if (!v.is_number())
      raise("TypeError",
            "bad operand type for unary " + std::string(minus ? "-" : "+") + ": '" + v.type_repr() + "'");
    if (!minus) return v;
    return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
  }
};

struct Logic : Expr {
  ExprPtr left, right;
  bool is_and = true;
  // Python returns the deciding operand, not a bool.
  Value eval(Interpreter& in) const override {
    Value l = left->eval(in);
    if (is_and ? !l.truthy() : l.truthy()) return l;
    return right->eval(in);
  }
};

struct Conditional : Expr {
  ExprPtr cond, then, otherwise;
  Value eval(Interpreter& in) const override {
    if (cond->eval(in).truthy()) return then->eval(in);
    if (otherwise) return otherwise->eval(in);
    return Value::undefined("the inline if-expression on line " + std::to_string(line) +
                            " evaluated to false and no else section was defined.");
  }
};

Value arithmetic(const std::string& op, const Value& l, const Value& r) {
  if (l.is_undefined()) undefined_error(l);
  if (r.is_undefined()) undefined_error(r);
  auto type_error = [&]() -> Value {
    raise("TypeError",
          "unsupported operand type(s) for " + op + ": '" + l.type_repr() + "' and '" + r.type_repr() + "'");
  };
  bool ints = (l.is_int() || l.is_bool()) && (r.is_int() || r.is_bool());
  if (op == "+") {
    if (l.is_string() && r.is_string()) return Value(l.as_string() + r.as_string());
    if (l.is_list() && r.is_list()) {
      List out = l.as_list();
      out.insert(out.end(), r.as_list().begin(), r.as_list().end());
      return Value(std::move(out));
    }
    if (l.is_string() || r.is_string())
      raise("TypeError",
            "can only concatenate str (not \"" +
                (l.is_string() ? r : l).type_repr().substr(0, (l.is_string() ? r : l).type_repr().find(' ')) +
                "\") to str");
    if (!l.is_number() || !r.is_number()) return type_error();
    return ints ? Value(l.as_int() + r.as_int()) : Value(l.as_float() + r.as_float());
  }
  if (op == "*") {
    const Value* seq = l.is_string() || l.is_list() ? &l : r.is_string() || r.is_list() ? &r : nullptr;
    if (seq) {
      const Value& n = seq == &l ? r : l;
      if (!(n.is_int() || n.is_bool())) return type_error();
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n.as_int(); ++i) out += seq->as_string();
        return Value(out);
      }
      List out;
      for (int64_t i = 0; i < n.as_int(); ++i)
        out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
      return Value(std::move(out));
    }
    if (!l.is_number() || !r.is_number()) return type_error();
    return ints ? Value(l.as_int() * r.as_int()) : Value(l.as_float() * r.as_float());
  }
  if (op == "%" && l.is_string())
    return Value(percent_format(l.as_string(), r.is_list() ? r.as_list() : List{r}));
  if (!l.is_number() || !r.is_number()) return type_error();
  if (op == "-") return ints ? Value(l.as_int() - r.as_int()) : Value(l.as_float() - r.as_float());
  if (op == "**") {
    if (ints && r.as_int() >= 0) {
      int64_t out = 1;
      for (int64_t i = 0; i < r.as_int(); ++i) out *= l.as_int();
      return Value(out);
    }
    return Value(std::pow(l.as_float(), r.as_float()));
  }
  if ((op == "/" || op == "//" || op == "%") && r.as_float() == 0)
    raise("ZeroDivisionError", ints ? "integer division or modulo by zero" : "float division by zero");
  if (op == "/") return Value(l.as_float() / r.as_float());
  if (op == "//") {
    if (ints) {
      int64_t q = l.as_int() / r.as_int();
      if ((l.as_int() % r.as_int() != 0) && ((l.as_int() < 0) != (r.as_int() < 0))) --q;
      return Value(q);
    }
    return Value(std::floor(l.as_float() / r.as_float()));
  }
  if (op == "%") {
    if (ints) {
      int64_t m = l.as_int() % r.as_int();
      if (m != 0 && ((m < 0) != (r.as_int() < 0))) m += r.as_int();
      return Value(m);
    }
    double m = std::fmod(l.as_float(), r.as_float());
    if (m != 0 && ((m < 0) != (r.as_float() < 0))) m += r.as_float();
    return Value(m);
  }
  return type_error();
}

struct Binary : Expr {
  std::string op;
  ExprPtr left, right;
  Value eval(Interpreter& in) const override { return arithmetic(op, left->eval(in), right->eval(in)); }
};

struct Concat : Expr {
  std::vector<ExprPtr> parts;
  Value eval(Interpreter& in) const override {
    std::string out;
    for (const auto& p : parts) out += to_string(p->eval(in));
    return Value(out);
  }
};

struct Compare : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;
  Value eval(Interpreter& in) const override {
    Value l = first->eval(in);
    for (const auto& [op, e] : rest) {
      Value r = e->eval(in);
      bool ok;
      if (op == "==")
        ok = equals(l, r);
      else if (op == "!=")
        ok = !equals(l, r);
      else if (op == "in")
        ok = contains(r, l);
      else if (op == "notin")
        ok = !contains(r, l);
      else if (op == "<")
        ok = compare(l, r, "<") < 0;
      else if (op == "<=")
        ok = compare(l, r, "<=") <= 0;
      else if (op == ">")
        ok = compare(l, r, ">") > 0;
      else
        ok = compare(l, r, ">=") >= 0;
      if (!ok) return Value(false);
      l = std::move(r);
    }
    return Value(true);
  }
};

// ================================================================================================
// Statement nodes
// ================================================================================================

Flow exec_body(Interpreter& in, const Body& body, std::string& out) {
  for (const auto& s : body) {
    Flow f = s->exec(in, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

struct TextStmt : Stmt {
  std::string text;
  Flow exec(Interpreter&, std::string& out) const override {
    out += text;
    return Flow::kNormal;
  }
};

struct OutputStmt : Stmt {
  ExprPtr expr;
  Flow exec(Interpreter& in, std::string& out) const override {
    out += to_string(expr->eval(in));
    return Flow::kNormal;
  }
};

struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  Flow exec(Interpreter& in, std::string& out) const override {
    for (const auto& [cond, body] : branches)
      if (cond->eval(in).truthy()) return exec_body(in, body, out);
    return exec_body(in, otherwise, out);
  }
};

void assign_targets(Interpreter& in, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    in.assign(targets[0], v);
    return;
  }
  List items = iterate(v);
  if (items.size() != targets.size())
    raise("ValueError", "line " + std::to_string(line) + ": cannot unpack " + std::to_string(items.size()) +
                            " values into " + std::to_string(targets.size()) + " names");
  for (size_t i = 0; i < targets.size(); ++i) in.assign(targets[i], items[i]);
}

struct ForStmt : Stmt {
  std::vector<std::string> targets;
  ExprPtr iterable;
  ExprPtr filter;  // for x in xs if cond
  Body body, otherwise;
  Flow exec(Interpreter& in, std::string& out) const override {
    List items = iterate(iterable->eval(in));
    if (filter) {
      List kept;
      for (const Value& x : items) {
        bool keep = in.scoped(in.frame, [&] {
          assign_targets(in, targets, x, line);
          return filter->eval(in).truthy();
        });
        if (keep) kept.push_back(x);
      }
      items.swap(kept);
    }
    if (items.empty()) return exec_body(in, otherwise, out);
    size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      Flow f = in.scoped(in.frame, [&] {
        auto loop = std::make_shared<Dict>();
        auto idx = static_cast<int64_t>(i);
        auto len = static_cast<int64_t>(n);
        loop->items = {{"index", Value(idx + 1)},
                       {"index0", Value(idx)},
                       {"revindex", Value(len - idx)},
                       {"revindex0", Value(len - idx - 1)},
                       {"first", Value(i == 0)},
                       {"last", Value(i + 1 == n)},
                       {"length", Value(len)},
                       {"depth", Value(1)},
                       {"depth0", Value(0)}};
        loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
        loop->set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
        loop->set("cycle", Value::function("cycle", [i](Args& a) {
                    if (a.positional.empty()) raise("TypeError", "no items for cycling given");
                    return a.positional[i % a.positional.size()];
                  }));
        in.assign("loop", Value(loop));
        assign_targets(in, targets, items[i], line);
        return exec_body(in, body, out);
      });
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }
};

struct SetStmt : Stmt {
  std::vector<std::string> targets;
  std::string attribute;  // set ns.attribute = ...
  ExprPtr value;
  Body body;  // block form: {% set x %}...{% endset %}
  Flow exec(Interpreter& in, std::string&) const override {
    Value v;
    if (value) {
      v = value->eval(in);
    } else {
      std::string captured;
      exec_body(in, body, captured);
      v = Value(captured);
    }
    if (!attribute.empty()) {
      Value ns = in.lookup(targets[0]);
      if (!ns.is_dict() || !ns.as_dict().is_namespace)
        raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
      ns.as_dict().set(attribute, std::move(v));
      return Flow::kNormal;
    }
    assign_targets(in, targets, v, line);
    return Flow::kNormal;
  }
};

using Params = std::vector<std::pair<std::string, ExprPtr>>;  // name, default (may be null)

// A macro (or a call block's `caller`) as a callable that renders `body` with the arguments bound, in a new
// scope under `defining` (the frame the macro was defined in: it sees that frame's variables at call time).
// Weak: a macro is stored in the frame it captures, and a strong reference would leak both.
Value make_macro(Interpreter& in, const std::string& name, const Params& params, const Body& body,
                 bool uses_caller) {
  std::weak_ptr<Frame> defining = in.frame;
  Interpreter* interp = &in;
  return Value::function(name, [interp, defining, &name, &params, &body, uses_caller](Args& a) {
    if (interp->depth > 256) raise("RecursionError", "macro '" + name + "' recursed too deeply");
    ++interp->depth;
    struct Depth {
      Interpreter* in;
      ~Depth() { --in->depth; }
    } guard{interp};
    auto scope = defining.lock();
    if (!scope) raise("TemplateRuntimeError", "macro '" + name + "' called outside its scope");
    return interp->scoped(scope, [&] {
      List varargs;
      auto kwargs = std::make_shared<Dict>();
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < params.size()) {
          interp->assign(params[i].first, a.positional[i]);
        } else {
          varargs.push_back(a.positional[i]);
        }
      }
      // Jinja2 passes a call block's body as the keyword `caller`, which only a macro whose body names
      // `caller` accepts (with its own wording for the error).
      bool has_caller = false;
      for (const auto& [k, v] : a.keyword) {
        if (k == "caller" && uses_caller) {
          interp->assign(k, v);
          has_caller = true;
          continue;
        }
        if (k == "caller")
          raise("TypeError",
                "macro '" + name +
                    "' was invoked with two values for the special caller argument. This is most "
                    "likely a bug.");
        const std::string& key = k;  // clang 14 does not capture a structured binding
        bool is_param =
            std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == key; });
        if (is_param) {
          interp->assign(k, v);
        } else {
          kwargs->set(k, v);
        }
      }
      if (uses_caller && !has_caller) interp->assign("caller", Value::undefined("No caller defined"));
      for (size_t i = a.positional.size(); i < params.size(); ++i) {
        const auto& [pname, dflt] = params[i];
        if (interp->frame->vars.count(pname)) continue;
        interp->assign(pname, dflt ? dflt->eval(*interp)
                                   : Value::undefined("parameter '" + pname + "' was not provided"));
      }
      interp->assign("varargs", Value(std::move(varargs)));
      interp->assign("kwargs", Value(kwargs));
      std::string out;
      exec_body(*interp, body, out);
      return Value(out);
    });
  });
}

struct MacroStmt : Stmt {
  std::string name;
  Params params;
  Body body;
  bool uses_caller = false;  // the body names `caller`: it may be called from a {% call %} block
  Flow exec(Interpreter& in, std::string&) const override {
    in.assign(name, make_macro(in, name, params, body, uses_caller));
    return Flow::kNormal;
  }
};

// {% call(params) macro(args) %}body{% endcall %}: calls the macro with the body as a macro named `caller`
// (seeing the variables where the block is) and outputs what the macro returns.
struct CallBlock : Stmt {
  Params caller_params;
  Body body;
  ExprPtr call;  // a Call expression
  Flow exec(Interpreter& in, std::string& out) const override {
    static const std::string kCaller = "caller";
    const auto& c = static_cast<const Call&>(*call);
    Value f = c.callee->eval(in);
    if (f.is_undefined()) undefined_error(f);
    if (!f.is_callable()) raise("TypeError", "'" + f.type_repr() + "' is not callable");
    Args a = eval_args(in, c.args);
    a.keyword.emplace_back(kCaller, make_macro(in, kCaller, caller_params, body, false));
    out += to_string(f.as_function()(a));
    return Flow::kNormal;
  }
};

struct LoopControl : Stmt {
  Flow flow;
  Flow exec(Interpreter&, std::string&) const override { return flow; }
};

struct FilterBlock : Stmt {
  std::vector<std::pair<std::string, CallArgs>> filters;
  Body body;
  Flow exec(Interpreter& in, std::string& out) const override {
    std::string captured;
    exec_body(in, body, captured);
    Value v(captured);
    for (const auto& [name, args] : filters) {
      Args a = eval_args(in, args);
      v = apply_filter(in, name, v, a);
    }
    out += to_string(v);
    return Flow::kNormal;
  }
};

struct BodyStmt : Stmt {  // {% generation %}: transformers' assistant-mask marker, renders its body
  Body body;
  Flow exec(Interpreter& in, std::string& out) const override { return exec_body(in, body, out); }
};

// ================================================================================================
// Parser
// ================================================================================================

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    Body body = parse_body({});
    if (peek().type != Tok::kEnd) error("unexpected '" + peek_block_name() + "'");
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void error(const std::string& message) const {
    raise("TemplateSyntaxError", "line " + std::to_string(peek().line) + ": " + message);
  }
  bool at_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == Tok::kOp && peek(ahead).text == op;
  }
  bool at_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Tok::kName && peek(ahead).text == name;
  }
  void expect_op(const char* op) {
    if (!at_op(op)) error(std::string("expected '") + op + "', got '" + describe(peek()) + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) error("expected a name, got '" + describe(peek()) + "'");
    return next().text;
  }
  void expect_block_end() {
    if (peek().type != Tok::kBlockEnd)
      error("expected end of statement block, got '" + describe(peek()) + "'");
    ++p_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEnd:
        return "end of template";
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarEnd:
        return "}}";
      case Tok::kText:
        return "text";
      default:
        return t.text;
    }
  }
  std::string peek_block_name() const {
    if (peek().type == Tok::kBlockBegin && peek(1).type == Tok::kName) return peek(1).text;
    return describe(peek());
  }

  // Parses statements until a block whose name is in `ends` (left unconsumed: the caller reads it).
  Body parse_body(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.type == Tok::kEnd) {
        if (!ends.empty()) {
          std::string names;
          for (const auto& e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
          error("unexpected end of template, expected " + names);
        }
        return body;
      }
      if (tok.type == Tok::kText) {
        auto s = std::make_unique<TextStmt>();
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (tok.type == Tok::kVarBegin) {
        ++p_;
        auto s = std::make_unique<OutputStmt>();
        s->line = tok.line;
        s->expr = parse_expression();
        if (peek().type != Tok::kVarEnd) error("expected '}}', got '" + describe(peek()) + "'");
        ++p_;
        body.push_back(std::move(s));
      } else if (tok.type == Tok::kBlockBegin) {
        if (peek(1).type != Tok::kName) error("expected a statement name after '{%'");
        const std::string& name = peek(1).text;
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) return body;
        ++p_;
        body.push_back(parse_statement());
      } else {
        error("unexpected '" + describe(tok) + "'");
      }
    }
  }

  // Consumes "{% name" of the block that ended a body.
  std::string take_block_name() {
    ++p_;  // {%
    return next().text;
  }

  StmtPtr parse_statement() {
    int line = peek().line;
    std::string name = next().text;
    StmtPtr s;
    if (name == "if") {
      s = parse_if();
    } else if (name == "for") {
      s = parse_for();
    } else if (name == "set") {
      s = parse_set();
    } else if (name == "macro") {
      s = parse_macro();
    } else if (name == "call") {
      s = parse_call_block();
    } else if (name == "break" || name == "continue") {
      auto c = std::make_unique<LoopControl>();
      c->flow = name == "break" ? Flow::kBreak : Flow::kContinue;
      expect_block_end();
      s = std::move(c);
    } else if (name == "filter") {
      auto f = std::make_unique<FilterBlock>();
      do {
        std::string fname = expect_name();
        CallArgs args;
        if (at_op("(")) args = parse_call_args();
        f->filters.emplace_back(fname, std::move(args));
      } while (at_op("|") && (++p_, true));
      expect_block_end();
      f->body = parse_body({"endfilter"});
      take_block_name();
      expect_block_end();
      s = std::move(f);
    } else if (name == "generation") {
      auto g = std::make_unique<BodyStmt>();
      expect_block_end();
      g->body = parse_body({"endgeneration"});
      take_block_name();
      expect_block_end();
      s = std::move(g);
    } else {
      error("unknown statement '" + name + "'");
    }
    s->line = line;
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>();
    ExprPtr cond = parse_expression();
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      std::string end = take_block_name();
      if (end == "elif") {
        cond = parse_expression();
        expect_block_end();
        continue;
      }
      expect_block_end();
      if (end == "else") {
        s->otherwise = parse_body({"endif"});
        take_block_name();
        expect_block_end();
      }
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = at_op("(");
    if (paren) ++p_;
    names.push_back(expect_name());
    while (at_op(",")) {
      ++p_;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>();
    s->targets = parse_targets();
    if (!at_name("in")) error("expected 'in' in for loop");
    ++p_;
    s->iterable = parse_conditional(false);
    if (at_name("if")) {
      ++p_;
      s->filter = parse_conditional(true);
    }
    if (at_name("recursive")) error("recursive for loops are not supported");
    expect_block_end();
    s->body = parse_body({"else", "endfor"});
    if (take_block_name() == "else") {
      expect_block_end();
      s->otherwise = parse_body({"endfor"});
      take_block_name();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    auto s = std::make_unique<SetStmt>();
    if (peek().type == Tok::kName && at_op(".", 1)) {
      s->targets.push_back(next().text);
      ++p_;
      s->attribute = expect_name();
    } else {
      s->targets = parse_targets();
    }
    if (at_op("=")) {
      ++p_;
      s->value = parse_tuple_or_expression();
      expect_block_end();
      return s;
    }
    if (!s->attribute.empty() || s->targets.size() != 1) error("expected '=' in set");
    expect_block_end();
    s->body = parse_body({"endset"});
    take_block_name();
    expect_block_end();
    return s;
  }

  Params parse_params() {
    Params params;
    expect_op("(");
    while (!at_op(")")) {
      std::string pname = expect_name();
      ExprPtr dflt;
      if (at_op("=")) {
        ++p_;
        dflt = parse_expression();
      }
      params.emplace_back(pname, std::move(dflt));
      if (!at_op(")")) expect_op(",");
    }
    ++p_;
    return params;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>();
    s->name = expect_name();
    s->params = parse_params();
    expect_block_end();
    size_t callers_before = caller_names_;
    s->body = parse_body({"endmacro"});
    s->uses_caller = caller_names_ != callers_before;
    take_block_name();
    if (peek().type == Tok::kName) ++p_;  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<CallBlock>();
    if (at_op("(")) s->caller_params = parse_params();
    s->call = parse_expression();
    if (!dynamic_cast<const Call*>(s->call.get())) error("expected a macro call after 'call'");
    expect_block_end();
    s->body = parse_body({"endcall"});
    take_block_name();
    expect_block_end();
    return s;
  }

  // ---- expressions, lowest precedence first (Jinja2's parser order) ----

  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!at_op(",")) return first;
    auto list = std::make_unique<ListExpr>();
    list->items.push_back(std::move(first));
    while (at_op(",")) {
      ++p_;
      if (peek().type == Tok::kBlockEnd || peek().type == Tok::kVarEnd) break;
      list->items.push_back(parse_expression());
    }
    return list;
  }

  ExprPtr parse_expression() { return parse_conditional(true); }

  ExprPtr parse_conditional(bool with_condexpr) {
    ExprPtr e = parse_or();
    while (with_condexpr && at_name("if")) {
      int line = peek().line;
      ++p_;
      auto c = std::make_unique<Conditional>();
      c->line = line;
      c->cond = parse_or();
      if (at_name("else")) {
        ++p_;
        c->otherwise = parse_conditional(true);
      }
      c->then = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      ++p_;
      auto l = std::make_unique<Logic>();
      l->is_and = false;
      l->left = std::move(e);
      l->right = parse_and();
      e = std::move(l);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      ++p_;
      auto l = std::make_unique<Logic>();
      l->left = std::move(e);
      l->right = parse_not();
      e = std::move(l);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      ++p_;
      auto n = std::make_unique<Not>();
      n->operand = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    auto c = std::make_unique<Compare>();
    while (true) {
      std::string op;
      if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        ++p_;
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        p_ += 2;
        op = "notin";
      } else {
        break;
      }
      c->rest.emplace_back(op, parse_math1());
    }
    if (c->rest.empty()) return e;
    c->first = std::move(e);
    return c;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r) {
    auto b = std::make_unique<Binary>();
    b->op = std::move(op);
    b->left = std::move(l);
    b->right = std::move(r);
    return b;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (at_op("+") || at_op("-")) {
      std::string op = next().text;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    if (!at_op("~")) return e;
    auto c = std::make_unique<Concat>();
    c->parts.push_back(std::move(e));
    while (at_op("~")) {
      ++p_;
      c->parts.push_back(parse_math2());
    }
    return c;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = next().text;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (at_op("**")) {
      ++p_;
      e = binary("**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      bool minus = next().text == "-";
      auto n = std::make_unique<Negate>();
      n->minus = minus;
      n->operand = parse_unary(false);
      e = std::move(n);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_and_test(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    int line = tok.line;
    auto literal = [&](Value v) {
      auto l = std::make_unique<Literal>();
      l->value = std::move(v);
      l->line = line;
      return l;
    };
    switch (tok.type) {
      case Tok::kName: {
        std::string n = next().text;
        if (n == "true" || n == "True") return literal(Value(true));
        if (n == "false" || n == "False") return literal(Value(false));
        if (n == "none" || n == "None") return literal(Value::none());
        if (n == "caller") ++caller_names_;
        auto e = std::make_unique<Name>();
        e->name = n;
        e->line = line;
        return e;
      }
      case Tok::kString: {
        std::string s = next().text;
        while (peek().type == Tok::kString) s += next().text;  // adjacent literals concatenate
        return literal(Value(s));
      }
      case Tok::kInt:
        return literal(Value(next().int_value));
      case Tok::kFloat:
        return literal(Value(next().float_value));
      case Tok::kOp:
        if (tok.text == "(") {
          ++p_;
          if (at_op(")")) {
            ++p_;
            return std::make_unique<ListExpr>();
          }
          ExprPtr e = parse_expression();
          if (at_op(",")) {  // tuple
            auto l = std::make_unique<ListExpr>();
            l->items.push_back(std::move(e));
            while (at_op(",")) {
              ++p_;
              if (at_op(")")) break;
              l->items.push_back(parse_expression());
            }
            e = std::move(l);
          }
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          ++p_;
          auto l = std::make_unique<ListExpr>();
          while (!at_op("]")) {
            l->items.push_back(parse_expression());
            if (!at_op("]")) expect_op(",");
          }
          ++p_;
          return l;
        }
        if (tok.text == "{") {
          ++p_;
          auto d = std::make_unique<DictExpr>();
          while (!at_op("}")) {
            ExprPtr k = parse_expression();
            expect_op(":");
            d->items.emplace_back(std::move(k), parse_expression());
            if (!at_op("}")) expect_op(",");
          }
          ++p_;
          return d;
        }
        break;
      default:
        break;
    }
    error("unexpected '" + describe(tok) + "'");
  }

  CallArgs parse_call_args() {
    expect_op("(");
    CallArgs args;
    while (!at_op(")")) {
      if (peek().type == Tok::kName && at_op("=", 1)) {
        std::string k = next().text;
        ++p_;
        args.keyword.emplace_back(k, parse_expression());
      } else {
        args.positional.push_back(parse_expression());
      }
      if (!at_op(")")) expect_op(",");
    }
    ++p_;
    return args;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = peek().line;
      if (at_op(".")) {
        ++p_;
        auto g = std::make_unique<GetAttr>();
        g->line = line;
        g->obj = std::move(e);
        if (peek().type == Tok::kInt) {  // x.0 is an item lookup
          auto gi = std::make_unique<GetItem>();
          gi->obj = std::move(g->obj);
          auto lit = std::make_unique<Literal>();
          lit->value = Value(next().int_value);
          gi->key = std::move(lit);
          e = std::move(gi);
          continue;
        }
        g->name = expect_name();
        e = std::move(g);
      } else if (at_op("[")) {
        ++p_;
        ExprPtr parts[3];
        int colons = 0;
        while (!at_op("]")) {
          if (at_op(":")) {
            if (++colons > 2) error("too many ':' in slice");
            ++p_;
            continue;
          }
          if (parts[colons]) error("expected ':' or ']' in subscript");
          parts[colons] = parse_expression();
        }
        ++p_;
        if (colons == 0) {
          if (!parts[0]) error("empty subscript");
          auto g = std::make_unique<GetItem>();
          g->obj = std::move(e);
          g->key = std::move(parts[0]);
          e = std::move(g);
        } else {
          auto s = std::make_unique<SliceExpr>();
          s->obj = std::move(e);
          s->start = std::move(parts[0]);
          s->stop = std::move(parts[1]);
          s->step = std::move(parts[2]);
          e = std::move(s);
        }
      } else if (at_op("(")) {
        auto c = std::make_unique<Call>();
        c->line = line;
        c->callee = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_and_test(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        ++p_;
        auto f = std::make_unique<FilterExpr>();
        f->line = peek().line;
        f->name = expect_name();
        if (!is_known_filter(f->name)) error("no filter named '" + f->name + "'");
        if (at_op("(")) f->args = parse_call_args();
        f->subject = std::move(e);
        e = std::move(f);
      } else if (at_name("is")) {
        ++p_;
        auto t = std::make_unique<TestExpr>();
        t->line = peek().line;
        if (at_name("not")) {
          ++p_;
          t->negated = true;
        }
        if (peek().type == Tok::kName) {
          t->name = next().text;
        } else if (peek().type == Tok::kOp) {  // is == x, is >= x
          t->name = next().text;
        } else {
          error("expected a test name after 'is'");
        }
        if (!is_known_test(t->name)) error("no test named '" + t->name + "'");
        if (at_op("(")) {
          t->args = parse_call_args();
        } else if ((peek().type == Tok::kName || peek().type == Tok::kString || peek().type == Tok::kInt ||
                    peek().type == Tok::kFloat || at_op("(") || at_op("[") || at_op("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and") && !at_name("if") &&
                   !at_name("not") && !at_name("in") && !at_name("is")) {
          t->args.positional.push_back(parse_postfix(parse_primary()));
        }
        t->subject = std::move(e);
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  size_t caller_names_ = 0;  // references to `caller` parsed so far (a macro naming it accepts a call block)
};

Value make_globals_namespace(Args& a) {
  auto d = std::make_shared<Dict>();
  d->is_namespace = true;
  for (const Value& p : a.positional)
    if (p.is_dict())
      for (const auto& [k, v] : p.as_dict().items) d->set(k, v);
  for (const auto& [k, v] : a.keyword) d->set(k, v);
  return Value(d);
}

}  // namespace

// ================================================================================================
// Template
// ================================================================================================

struct Template::Program {
  Body body;
};

Template::Template(const std::string& source, Options options) : program_(std::make_unique<Program>()) {
  program_->body = Parser(lex(source, options)).parse_template();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& variables) const {
  Interpreter in;
  auto globals = std::make_shared<Frame>();
  globals->vars["raise_exception"] = Value::function("raise_exception", [](Args& a) -> Value {
    raise("TemplateError", a.positional.empty() ? "" : to_string(a.positional[0]));
  });
  globals->vars["namespace"] = Value::function("namespace", make_globals_namespace);
  globals->vars["dict"] = Value::function("dict", [](Args& a) {
    auto d = std::make_shared<Dict>();
    for (const Value& p : a.positional)
      if (p.is_dict())
        for (const auto& [k, v] : p.as_dict().items) d->set(k, v);
    for (const auto& [k, v] : a.keyword) d->set(k, v);
    return Value(d);
  });
  globals->vars["range"] = Value::function("range", [](Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else if (a.positional.size() >= 2) {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() > 2) step = a.positional[2].as_int();
    }
    if (step == 0) raise("ValueError", "range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      out.emplace_back(i);
      if (out.size() > 100000) raise("OverflowError", "range too big");
    }
    return Value(std::move(out));
  });
  globals->vars["strftime_now"] = Value::function("strftime_now", [](Args& a) {
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof(buf), to_string(arg(a, 0, "format", Value(""))).c_str(), &tm);
    return Value(std::string(buf, n));
  });
  auto top = std::make_shared<Frame>();
  top->parent = globals;
  if (variables.is_object())
    for (auto it = variables.begin(); it != variables.end(); ++it)
      top->vars[it.key()] = Value::from_json(it.value());
  in.frame = top;
  std::string out;
  exec_body(in, program_->body, out);
  return out;
}

}  // namespace moeserve::text::jinja
