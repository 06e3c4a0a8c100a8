#pragma once
// Number bounds of structured output (minimum, maximum, exclusiveMinimum, exclusiveMaximum), decided exactly
// on the number's text as the model writes it. A prefix ("-", "1e", "12.") is accepted only while some JSON
// number that starts with it is in bounds, and a number ends only in bounds, so decoding can neither walk
// into a number it cannot finish nor finish one out of range. Values are exact decimals, so a bound holds for
// numbers of any length ("0.30000000000000000001" > 0.3); JSON Schema validators that compare doubles differ
// only past 17 significant digits.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve {

// sign * 0.digits * 10^exponent; digits has no leading or trailing zeros (empty: the value is zero).
// Exponents saturate at +-kMaxExponent: past that, nothing a schema's bound can tell apart.
struct Decimal {
  static constexpr int64_t kMaxExponent = int64_t{1} << 50;
  bool negative = false;
  std::string digits;
  int64_t exponent = 0;

  bool zero() const { return digits.empty(); }
  // A JSON number's whole text; nullopt if it is not one.
  static std::optional<Decimal> parse(std::string_view text);
};

// -1, 0, 1 as a < b, a == b, a > b.
int compare(const Decimal& a, const Decimal& b);

// An interval of numbers; an absent end is unbounded. For an integer schema the ends are the first and last
// integers inside the bounds (closed), so that every test below is about integers.
struct NumberBounds {
  std::optional<Decimal> lo, hi;
  bool lo_open = false, hi_open = false;
  bool integer = false;
  // multipleOf (0: none), on integer schemas only. Its numbers are kept below kMaxStepMagnitude in
  // magnitude, where a double (what validators divide) holds every integer exactly.
  int64_t multiple = 0;
  static constexpr int64_t kMaxStepMagnitude = 999'999'999'999'999;

  // Throws nothing; for an integer schema the ends are moved to the integers inside (an open 3 is 4).
  static NumberBounds make(std::optional<Decimal> lo, bool lo_open, std::optional<Decimal> hi, bool hi_open,
                           bool integer);
  bool contains(const Decimal& v) const;
  // Some number (an integer, if `integer`) whose JSON text starts with `prefix` is inside. The prefix is one
  // the number grammar allows (integers: an optional '-' and digits).
  bool viable(std::string_view prefix) const;
  // No number (no integer, no multiple) is inside: a schema error.
  bool empty() const;

 private:
  bool multiple_viable(std::string_view prefix) const;
};

}  // namespace moeserve
