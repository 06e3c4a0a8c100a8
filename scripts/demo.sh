#!/usr/bin/env bash
# The main job: builds moeserve, starts a local cluster (3 `moeserve serve --model demo` nodes behind
# `moeserve route`), sends requests through the router with curl, prints the status table and stops it all.
# The demo model is the tiny Qwen3.5 MoE preset with random weights and the real Qwen3 vocabulary: the answers
# are gibberish, the serving path is the real one. Ports: ROUTER_PORT (8000) and BASE_PORT.. (30001..).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
router_port=${ROUTER_PORT:-8000}
base_port=${BASE_PORT:-30001}
dir=.moeserve-cluster
build/moeserve cluster up --local 3 --model demo --dir "$dir" --router-port "$router_port" --base-port "$base_port"
trap 'build/moeserve cluster down --dir "$dir"' EXIT
url=http://127.0.0.1:$router_port

echo; echo "== a chat completion through the router"
curl -sS "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"demo","max_tokens":16,"messages":[{"role":"user","content":"Hello, cluster!"}]}'
echo; echo; echo "== a streamed one (tokens arrive as they are generated)"
curl -sSN "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"demo","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Stream, please"}]}'
echo; echo "== six more, four at a time, so that every node gets some"
for i in 1 2 3 4 5 6; do
  curl -sS -o /dev/null -w "request $i: HTTP %{http_code} in %{time_total}s\n" "$url/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d "{\"model\":\"demo\",\"max_tokens\":32,\"messages\":[{\"role\":\"user\",\"content\":\"Question $i\"}]}" &
  if ((i % 4 == 0)); then wait; fi
done
wait
echo; echo "== the cluster (moeserve cluster status)"
build/moeserve cluster status --dir "$dir"
echo "== the router's view (GET /backends)"
curl -sS "$url/backends"; echo
