#include "engine/json_number.h"

#include <algorithm>
#include <string>

namespace moeserve {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

int64_t saturate(int64_t v) {
  return std::clamp(v, -Decimal::kMaxExponent, Decimal::kMaxExponent);
}

// 0.digits * 10^exponent of a digit string that may have leading and trailing zeros.
Decimal magnitude(std::string_view digits, int64_t exponent) {
  size_t first = 0;
  while (first < digits.size() && digits[first] == '0') ++first;
  size_t last = digits.size();
  while (last > first && digits[last - 1] == '0') --last;
  Decimal d;
  if (first == last) return d;
  d.digits = std::string(digits.substr(first, last - first));
  d.exponent = saturate(exponent - int64_t(first));
  return d;
}

Decimal negated(Decimal d) {
  if (!d.zero()) d.negative = !d.negative;
  return d;
}

// The magnitude 0.digits * 10^exponent plus one unit of its last digit ("0.129" -> "0.13", "0.99" -> "1.0").
Decimal next_at_last_digit(std::string digits, int64_t exponent) {
  size_t i = digits.size();
  while (i > 0 && digits[i - 1] == '9') digits[--i] = '0';
  if (i == 0) return magnitude("1", exponent + 1);
  ++digits[i - 1];
  return magnitude(digits, exponent);
}

bool is_integer(const Decimal& d) {
  return d.zero() || int64_t(d.digits.size()) <= d.exponent;
}

// |d| rounded towards zero, and whether anything was cut.
Decimal truncated(const Decimal& d, bool* cut) {
  *cut = !is_integer(d);
  if (d.exponent <= 0) return Decimal{};
  Decimal t = d;
  if (int64_t(t.digits.size()) > t.exponent) t.digits.resize(size_t(t.exponent));
  return magnitude(t.digits, t.exponent);
}

// An integer's magnitude plus or minus one (minus only for magnitudes >= 1).
Decimal step_magnitude(const Decimal& m, int delta) {
  std::string digits = m.digits;
  digits.resize(size_t(std::max<int64_t>(m.exponent, 0)), '0');
  if (delta > 0) {
    size_t i = digits.size();
    while (i > 0 && digits[i - 1] == '9') digits[--i] = '0';
    if (i == 0) return magnitude("1" + digits, int64_t(digits.size()) + 1);
    ++digits[i - 1];
  } else {
    size_t i = digits.size();
    while (i > 0 && digits[i - 1] == '0') digits[--i] = '9';
    --digits[i - 1];
  }
  return magnitude(digits, int64_t(digits.size()));
}

// An integer plus `delta` (+1 or -1).
Decimal plus(const Decimal& v, int delta) {
  if (v.zero()) {
    Decimal one = magnitude("1", 1);
    return delta > 0 ? one : negated(one);
  }
  const int towards = v.negative ? -delta : delta;  // on the magnitude
  Decimal m = step_magnitude(v, towards);
  m.negative = v.negative && !m.zero();
  return m;
}

// The least integer >= v (up) or the greatest <= v (down).
Decimal to_integer(const Decimal& v, bool up) {
  bool cut = false;
  Decimal t = truncated(v, &cut);
  t.negative = v.negative && !t.zero();
  if (cut && up != v.negative) t = plus(t, up ? 1 : -1);
  return t;
}

// A side of the bounds as seen by a number's magnitude: for a negative number the interval is mirrored.
struct Side {
  const std::optional<Decimal>& lo;
  const std::optional<Decimal>& hi;
  bool lo_open, hi_open;
};

bool above_lo(const Decimal& v, const Side& s) {
  if (!s.lo) return true;
  const int c = compare(v, *s.lo);
  return c > 0 || (c == 0 && !s.lo_open);
}
bool below_hi(const Decimal& v, const Side& s) {
  if (!s.hi) return true;
  const int c = compare(v, *s.hi);
  return c < 0 || (c == 0 && !s.hi_open);
}

// Some magnitude is inside the side (whose ends, clamped to a double's magnitudes, are both there and > 0).
bool meets_positive(const Side& s) {
  const int c = compare(*s.lo, *s.hi);
  return c < 0 || (c == 0 && !s.lo_open && !s.hi_open);
}

// Some magnitude whose significant digits start with `digits`, at a scale 0.digits * 10^e with e >= e_min
// (when given), is inside the side: low_e = 0.digits * 10^e must not pass hi and high_e (the next value at
// the last digit) must pass lo. Only e in [lo.exponent, hi.exponent] can do both; one strictly between them
// always does.
bool scaled_meets(const std::string& digits, std::optional<int64_t> e_min, const Side& s) {
  if (!s.hi) return true;
  if (compare(*s.hi, Decimal{}) <= 0) return false;  // the magnitudes here are > 0
  auto meets = [&](int64_t e) {
    return below_hi(magnitude(digits, e), s) && (!s.lo || compare(next_at_last_digit(digits, e), *s.lo) > 0);
  };
  if (!s.lo || compare(*s.lo, Decimal{}) <= 0) return !e_min || meets(*e_min);
  const int64_t first = std::max(s.lo->exponent, e_min.value_or(s.lo->exponent));
  if (first + 1 <= s.hi->exponent - 1) return true;
  for (int64_t e = first; e <= s.hi->exponent; ++e)
    if (meets(e)) return true;
  return false;
}

// Some m in {v, v0..v9, v00..v99, ...} (the exponent magnitudes that continue digits of value v) lies in
// [a, b] (b absent: unbounded).
bool exponent_meets(std::string_view digits, int64_t a, std::optional<int64_t> b) {
  int64_t v = 0;
  for (char c : digits) {
    v = v * 10 + (c - '0');
    if (v > Decimal::kMaxExponent) {
      v = Decimal::kMaxExponent + 1;  // past every finite bound below
      break;
    }
  }
  if (!b || v == 0) return true;
  for (int64_t low = v, span = 1; low <= *b; low *= 10, span *= 10)
    if (low + span - 1 >= a) return true;
  return false;
}

}  // namespace

std::optional<Decimal> Decimal::parse(std::string_view text) {
  size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  i += negative;
  const size_t int_start = i;
  while (i < text.size() && is_digit(text[i])) ++i;
  const size_t int_digits = i - int_start;
  if (int_digits == 0 || (int_digits > 1 && text[int_start] == '0')) return std::nullopt;
  std::string digits(text.substr(int_start, int_digits));
  if (i < text.size() && text[i] == '.') {
    const size_t frac_start = ++i;
    while (i < text.size() && is_digit(text[i])) ++i;
    if (i == frac_start) return std::nullopt;
    digits += text.substr(frac_start, i - frac_start);
  }
  int64_t exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    const bool minus = i < text.size() && text[i] == '-';
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    const size_t exp_start = i;
    for (; i < text.size() && is_digit(text[i]); ++i) exponent = saturate(exponent * 10 + (text[i] - '0'));
    if (i == exp_start) return std::nullopt;
    if (minus) exponent = -exponent;
  }
  if (i != text.size()) return std::nullopt;
  Decimal d = magnitude(digits, saturate(int64_t(int_digits) + exponent));
  d.negative = negative && !d.zero();
  return d;
}

int compare(const Decimal& a, const Decimal& b) {
  const int sa = a.zero() ? 0 : a.negative ? -1 : 1;
  const int sb = b.zero() ? 0 : b.negative ? -1 : 1;
  if (sa != sb || sa == 0) return sa < sb ? -1 : sa > sb ? 1 : 0;
  int magnitude_order = a.exponent != b.exponent         ? (a.exponent < b.exponent ? -1 : 1)
                        : a.digits.compare(b.digits) < 0 ? -1
                        : a.digits.compare(b.digits) > 0 ? 1
                                                         : 0;
  return sa * magnitude_order;
}

NumberBounds NumberBounds::make(std::optional<Decimal> lo, bool lo_open, std::optional<Decimal> hi,
                                bool hi_open, bool integer) {
  NumberBounds b;
  b.integer = integer;
  if (integer) {
    if (lo) lo = is_integer(*lo) ? (lo_open ? plus(*lo, 1) : *lo) : to_integer(*lo, true);
    if (hi) hi = is_integer(*hi) ? (hi_open ? plus(*hi, -1) : *hi) : to_integer(*hi, false);
    lo_open = hi_open = false;
  }
  b.lo = std::move(lo), b.hi = std::move(hi);
  b.lo_open = lo_open, b.hi_open = hi_open;
  return b;
}

// The magnitudes a double holds, from the least subnormal to the greatest finite: a bounded number outside
// them is not what a client's validator reads (ajv and pydantic parse 1e-999 as 0 and 1e999 as infinity), so
// it is not written.
const Decimal& least_double() {
  static const Decimal d = *Decimal::parse("5e-324");
  return d;
}
const Decimal& greatest_double() {
  static const Decimal d = *Decimal::parse("1.7976931348623157e308");
  return d;
}

namespace {

// An integer's value, when its magnitude is at most `limit`.
std::optional<int64_t> small_integer(const Decimal& v, int64_t limit) {
  if (v.zero()) return 0;
  if (v.exponent < int64_t(v.digits.size()) || v.exponent > 15) return std::nullopt;
  int64_t x = 0;
  for (char c : v.digits) x = x * 10 + (c - '0');
  for (int64_t k = int64_t(v.digits.size()); k < v.exponent; ++k) x *= 10;
  if (x > limit) return std::nullopt;
  return v.negative ? -x : x;
}

// v * 10^k.
Decimal shifted(Decimal v, int k) {
  if (!v.zero()) v.exponent += k;
  return v;
}

int64_t pow10(int k) {
  int64_t p = 1;
  while (k-- > 0) p *= 10;
  return p;
}

// Some multiple of `step` is in [from, to].
bool has_multiple(int64_t from, int64_t to, int64_t step) {
  if (from > to) return false;
  const int64_t below = to - ((to % step) + step) % step;  // the greatest multiple <= to
  return below >= from;
}

}  // namespace

int64_t NumberBounds::units_end(const std::optional<Decimal>& end, bool open, bool upper) const {
  const int64_t limit = max_units();
  if (!end) return upper ? limit : -limit;
  Decimal u = shifted(*end, scale);
  u = is_integer(u) ? (open ? plus(u, upper ? -1 : 1) : u) : to_integer(u, !upper);
  const Decimal most = *Decimal::parse(std::to_string(limit));
  if (compare(u, most) > 0) return limit;
  if (compare(u, negated(most)) < 0) return -limit;
  return *small_integer(u, limit);
}

// multipleOf: some number that starts with `prefix` (an optional '-', digits, and for a fractional step '.'
// and at most `scale` decimals) is a multiple within the ends and below max_units(). In units of
// 10^-scale its values are contiguous ranges: after a '.', the one range its decimals leave open; in the
// integer part, by how many digits follow, [v * 10^j * u, (v + 1) * 10^j * u - 1] with u = 10^scale. A few
// divisions decide it.
bool NumberBounds::multiple_viable(std::string_view prefix) const {
  const bool negative = !prefix.empty() && prefix[0] == '-';
  const std::string_view rest = prefix.substr(negative ? 1 : 0);
  const size_t dot = rest.find('.');
  const std::string_view digits = rest.substr(0, dot);
  const std::string_view decimals = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
  if (rest.find_first_not_of("0123456789.") != std::string_view::npos || decimals.size() > size_t(scale))
    return false;  // an exponent, or more decimals than the step has
  const int64_t limit = max_units(), unit = pow10(scale);
  const int64_t lo_end = units_end(lo, lo_open, false), hi_end = units_end(hi, hi_open, true);
  auto meets = [&](int64_t a, int64_t b) {  // magnitudes a..b, in units
    b = std::min(b, limit);
    return has_multiple(std::max(negative ? -b : a, lo_end), std::min(negative ? -a : b, hi_end), multiple);
  };
  if (prefix.empty()) return has_multiple(lo_end, hi_end, multiple);
  if (digits.empty()) return meets(0, limit);
  if (digits.size() > 15) return false;
  int64_t v = 0;
  for (char c : digits) v = v * 10 + (c - '0');
  if (v > limit / unit) return false;
  if (dot != std::string_view::npos) {
    const int64_t span = pow10(scale - int(decimals.size()));
    int64_t base = v * unit;
    for (size_t i = 0; i < decimals.size(); ++i) base += (decimals[i] - '0') * pow10(scale - 1 - int(i));
    return meets(base, base + span - 1);
  }
  if (digits[0] == '0') return meets(0, unit - 1);  // "0" and "-0": decimals at most may follow
  for (int64_t a = v * unit, span = unit; a <= limit; a *= 10, span *= 10)
    if (meets(a, a + span - 1)) return true;
  return false;
}

bool NumberBounds::contains(const Decimal& v) const {
  if (multiple) {
    const std::optional<int64_t> x = small_integer(shifted(v, scale), max_units());
    if (!x || *x % multiple != 0) return false;
  }
  const Side s{lo, hi, lo_open, hi_open};
  Decimal magnitude = v;
  magnitude.negative = false;
  const bool representable =
      v.zero() || (compare(magnitude, least_double()) >= 0 && compare(magnitude, greatest_double()) <= 0);
  return representable && above_lo(v, s) && below_hi(v, s);
}

bool NumberBounds::empty() const {
  if (multiple) return !multiple_viable("");
  if (!lo || !hi) return false;
  const int c = compare(*lo, *hi);
  return c > 0 || (c == 0 && (lo_open || hi_open));
}

bool NumberBounds::viable(std::string_view prefix) const {
  if (multiple) return multiple_viable(prefix);  // its ends are counted in the step's units
  if (prefix.empty()) return !empty();
  const bool negative = prefix[0] == '-';
  // The bounds on the magnitude: mirrored for a negative number.
  std::optional<Decimal> mlo = negative && hi ? std::optional(negated(*hi)) : negative ? std::nullopt : lo;
  std::optional<Decimal> mhi = negative && lo ? std::optional(negated(*lo)) : negative ? std::nullopt : hi;
  bool mlo_open = negative ? hi_open : lo_open, mhi_open = negative ? lo_open : hi_open;
  // Magnitudes other than zero also stay within a double's (see contains()).
  if (!mlo || compare(*mlo, least_double()) < 0) mlo = least_double(), mlo_open = false;
  if (!mhi || compare(*mhi, greatest_double()) > 0) mhi = greatest_double(), mhi_open = false;
  const Side side{mlo, mhi, mlo_open, mhi_open};

  size_t i = negative;
  std::string digits;  // the mantissa's, integer and fraction part
  size_t int_digits = 0;
  while (i < prefix.size() && is_digit(prefix[i])) digits += prefix[i++];
  int_digits = digits.size();
  if (i < prefix.size() && prefix[i] == '.')
    for (++i; i < prefix.size() && is_digit(prefix[i]); ++i) digits += prefix[i];
  size_t leading = 0;
  while (leading < digits.size() && digits[leading] == '0') ++leading;
  const std::string significant = digits.substr(leading);  // trailing zeros kept: they constrain what follows
  const int64_t scale = int64_t(int_digits) - int64_t(leading);

  if (i == prefix.size()) {  // still in the mantissa
    if (integer) {
      if (int_digits > 0 && significant.empty()) return contains(Decimal{});  // "0" or "-0": nothing follows
      if (significant.empty()) return contains(Decimal{}) || meets_positive(side);  // "-"
      return scaled_meets(significant, int64_t(int_digits), side);
    }
    // The exponent can still scale it anywhere: what counts is how its significant digits start.
    return significant.empty() ? contains(Decimal{}) || meets_positive(side)
                               : scaled_meets(significant, std::nullopt, side);
  }

  // In the exponent: the mantissa is known, value = m * 10^y for the exponents y its digits can still give.
  const Decimal m = magnitude(significant, scale);
  if (m.zero()) return contains(Decimal{});
  std::optional<int64_t> ya, yb;  // the exponents that put m inside the side (absent: unbounded)
  if (side.hi) {
    if (compare(*side.hi, Decimal{}) <= 0) return false;
    const int64_t y = side.hi->exponent - m.exponent;
    Decimal at = m;
    at.exponent += y;
    yb = below_hi(at, side) ? y : y - 1;
  }
  if (side.lo && compare(*side.lo, Decimal{}) > 0) {
    const int64_t y = side.lo->exponent - m.exponent;
    Decimal at = m;
    at.exponent += y;
    ya = above_lo(at, side) ? y : y + 1;
  }
  if (ya && yb && *ya > *yb) return false;
  ++i;                                  // 'e' or 'E'
  if (i == prefix.size()) return true;  // either sign
  const bool minus = prefix[i] == '-';
  if (prefix[i] == '-' || prefix[i] == '+') ++i;
  // The exponent's magnitude must land in [a, b].
  int64_t a = 0;
  std::optional<int64_t> b;
  if (!minus) {
    a = ya ? std::max<int64_t>(*ya, 0) : 0;
    b = yb;
  } else {
    a = yb ? std::max<int64_t>(-*yb, 0) : 0;
    if (ya) b = -*ya;
  }
  if (b && *b < a) return false;
  return exponent_meets(prefix.substr(i), a, b);
}

}  // namespace moeserve
