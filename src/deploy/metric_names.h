#pragma once
// The Prometheus series the generated alerts and dashboard query, in one place: what `moeserve serve` and
// `moeserve route` export on /metrics. tests/deploy checks every name used against the real endpoints.

namespace moeserve::deploy::metric {

// moeserve serve
inline constexpr const char* kRequestsRunning = "moeserve:num_requests_running";
inline constexpr const char* kRequestsWaiting = "moeserve:num_requests_waiting";
inline constexpr const char* kRequestSuccess = "moeserve:request_success_total";  // {finished_reason}
inline constexpr const char* kRequestErrors = "moeserve:request_errors_total";    // {status}
inline constexpr const char* kPromptTokens = "moeserve:prompt_tokens_total";
inline constexpr const char* kGenerationTokens = "moeserve:generation_tokens_total";
inline constexpr const char* kTtft = "moeserve:time_to_first_token_seconds";      // histogram
inline constexpr const char* kItl = "moeserve:inter_token_latency_seconds";       // histogram
inline constexpr const char* kE2e = "moeserve:e2e_request_latency_seconds";       // histogram
inline constexpr const char* kQueueTime = "moeserve:request_queue_time_seconds";  // histogram
inline constexpr const char* kPrefixQueries = "moeserve:prefix_cache_queries_total";
inline constexpr const char* kPrefixHits = "moeserve:prefix_cache_hits_total";
inline constexpr const char* kKvUsage = "moeserve:kv_cache_usage_perc";  // 0..1
inline constexpr const char* kMemoryUsed = "moeserve:memory_used_bytes";
inline constexpr const char* kMemoryTotal = "moeserve:memory_total_bytes";
inline constexpr const char* kThrottled = "moeserve:memory_throttled_requests_total";

// moeserve route
inline constexpr const char* kRouterResponses =
    "moeserve_router_responses_total";  // {code}: what clients got
inline constexpr const char* kRouterBackendRequests =
    "moeserve_router_backend_requests_total";                                        // {backend,status}
inline constexpr const char* kRouterInFlight = "moeserve_router_backend_in_flight";  // {backend}
inline constexpr const char* kRouterBackendUp = "moeserve_router_backend_up";        // {backend}
inline constexpr const char* kRouterDuration =
    "moeserve_router_backend_request_duration_seconds";                                           // histogram
inline constexpr const char* kRouterTtfb = "moeserve_router_backend_time_to_first_byte_seconds";  // histogram
inline constexpr const char* kRouterImbalance = "moeserve_router_load_imbalance";  // max / mean in-flight

}  // namespace moeserve::deploy::metric
