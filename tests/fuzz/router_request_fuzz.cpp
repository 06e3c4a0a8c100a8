// What the router reads from peers before it picks a backend: a client's request body (describe_request,
// for cache_aware, session affinity and model routing), and a backend's /metrics page and Retry-After. None
// of them may throw but describe_request, and that only a short JsonParseError (a 400) for a body that
// starts as JSON and is not JSON within the limits; any other body routes like one without the fields. A
// Retry-After must convert to a duration. The input is read whole as a metrics page and as a Retry-After
// value; then its first byte says which body fields the router needs (bit 0 key, bit 1 session, bit 2 model)
// and the rest is the body.
#include "common/bounded_json.h"
#include "fuzz_target.h"
#include "router/request_info.h"

namespace moeserve::fuzz {

Verdict fuzz_router_request(std::string_view data) {
  // Read for effect only: any page (NaN and negative gauges included) gives some load, never an exception.
  (void)router::parse_reported_load(data);
  // The proxy turns Retry-After into milliseconds as an int64_t.
  if (auto wait = router::parse_retry_after(data))
    FUZZ_CHECK(*wait >= 0 && *wait * 1000 < 9.2e18, "a Retry-After of {} seconds", *wait);

  router::BodyNeeds needs;
  std::string_view body = data;
  if (!body.empty()) {
    const auto flags = static_cast<unsigned char>(body.front());
    needs.key = flags & 1;
    needs.session = flags & 2;
    needs.model = flags & 4;
    body.remove_prefix(1);
  }
  const router::KeyEncoder bytes;
  router::RouteRequest route;
  try {
    route = router::describe_request(body, "", needs, bytes);
  } catch (const JsonParseError& e) {
    check_error_message(e.what());
    return Verdict::kRefused;
  }
  FUZZ_CHECK(needs.key || route.key.empty(), "a prefix key although none was asked for");
  FUZZ_CHECK(needs.session || route.session.empty(), "a session although none was asked for");
  return Verdict::kAccepted;
}

}  // namespace moeserve::fuzz
