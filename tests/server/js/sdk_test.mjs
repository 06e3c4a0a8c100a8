// Drives a running `moeserve serve` with the official OpenAI SDK, the way users do, and checks what the SDK
// hands back: chat and completions, streaming and not, logprobs, and errors surfacing as the SDK's typed
// exceptions with the right status. Usage: node sdk_test.mjs BASE_URL MODEL [API_KEY]
// The server must run with --max-concurrency 2 --max-queued-requests 1 --queue-timeout 1
// --max-request-body-mb 1 (the 413, 429 and 503 checks count on them).
// Prints one line per check; exits 1 if any failed.
import OpenAI from "openai";

const [baseURL, model, apiKey = "none"] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
let failures = 0;

function check(name, condition, detail = "") {
  console.log(`${condition ? "ok  " : "FAIL"} ${name}${condition ? "" : " " + detail}`);
  if (!condition) failures++;
}

async function expectError(name, status, cls, fn) {
  try {
    await fn();
    check(name, false, "no error thrown");
  } catch (e) {
    check(name, e instanceof cls && e.status === status, `${e?.constructor?.name} status=${e?.status} ${e?.message}`);
    return e;
  }
}

const messages = [{ role: "user", content: "Say hello." }];

const models = await client.models.list();
check("models.list returns the served model", models.data.length === 1 && models.data[0].id === model,
      JSON.stringify(models.data));

const chat = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
check("chat: one assistant choice", chat.choices.length === 1 && chat.choices[0].message.role === "assistant",
      JSON.stringify(chat));
check("chat: finish_reason", ["stop", "length"].includes(chat.choices[0].finish_reason), chat.choices[0].finish_reason);
check("chat: usage adds up",
      chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens &&
          chat.usage.completion_tokens > 0 && chat.usage.completion_tokens <= 8,
      JSON.stringify(chat.usage));

const stream = await client.chat.completions.create(
    { model, messages, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
let streamed = "";
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    streamed += (c.delta.content ?? "") + (c.delta.reasoning_content ?? "");
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check("chat stream: chunks, finish_reason and usage", chunks > 1 && finish !== null && usage?.completion_tokens > 0,
      `chunks=${chunks} finish=${finish} usage=${JSON.stringify(usage)}`);
const whole = (chat.choices[0].message.content ?? "") + (chat.choices[0].message.reasoning_content ?? "");
check("chat stream: same greedy text as non-streaming", streamed === whole,
      JSON.stringify({ streamed, whole }));

const n2 = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 2, seed: 7 });
check("chat: n=2 gives two choices", n2.choices.length === 2 && n2.choices[1].index === 1, JSON.stringify(n2.choices));

const lp = await client.chat.completions.create(
    { model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
const content = lp.choices[0].logprobs?.content ?? [];
check("chat: logprobs with top_logprobs", content.length > 0 && content[0].top_logprobs.length === 2 &&
      content[0].logprob <= 0, JSON.stringify(lp.choices[0].logprobs));

const completion = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, logprobs: 1,
                                                     temperature: 0 });
check("completions: text and logprobs", typeof completion.choices[0].text === "string" &&
      completion.choices[0].logprobs.tokens.length === completion.usage.completion_tokens,
      JSON.stringify(completion));

const cstream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0,
                                                  stream: true });
let ctext = "";
for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? "";
check("completions stream: same greedy text", ctext === completion.choices[0].text,
      JSON.stringify({ ctext, text: completion.choices[0].text }));

const bad = await expectError("400 on an invalid parameter", 400, OpenAI.BadRequestError,
                              () => client.chat.completions.create({ model, messages, temperature: 7 }));
check("400 names the parameter", bad?.param === "temperature", JSON.stringify(bad?.error));
await expectError("404 on an unknown model", 404, OpenAI.NotFoundError,
                  () => client.chat.completions.create({ model: "no-such-model", messages }));
if (apiKey !== "none") {
  const wrong = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "wrong-key", maxRetries: 0 });
  await expectError("401 on a wrong API key", 401, OpenAI.AuthenticationError, () => wrong.models.list());
}

// Parameters newer SDK versions and frameworks send are accepted (ignored when they change nothing here).
const extras = await client.chat.completions.create({
  model, messages, max_tokens: 2, temperature: 0, store: false, metadata: { run: "sdk" }, service_tier: "auto",
  parallel_tool_calls: false, reasoning_effort: "low", modalities: ["text"], response_format: { type: "text" },
  prediction: { type: "content", content: "hello" }, priority: 0, some_future_parameter: 1,
});
check("chat: unused parameters are accepted", extras.choices.length === 1, JSON.stringify(extras));
// Structured output: the random-weight model's answer parses and follows the schema.
const structured = await client.chat.completions.create({
  model, messages, max_tokens: 300, temperature: 0,
  response_format: { type: "json_schema", json_schema: { name: "verdict", strict: true, schema: {
    type: "object", properties: { ok: { type: "boolean" }, mood: { enum: ["calm", "busy"] } },
    required: ["ok", "mood"], additionalProperties: false } } },
});
let verdict = null;
try { verdict = JSON.parse(structured.choices[0].message.content); } catch { /* checked below */ }
check("json_schema: the content parses and follows the schema",
      structured.choices[0].finish_reason === "stop" && typeof verdict?.ok === "boolean" &&
      ["calm", "busy"].includes(verdict?.mood) && Object.keys(verdict).length === 2, JSON.stringify(structured));
const badSchema = await expectError("400 on an unsupported schema keyword", 400, OpenAI.BadRequestError,
    () => client.chat.completions.create({ model, messages, response_format: { type: "json_schema",
      json_schema: { name: "x", schema: { type: "array", items: { type: "integer" }, uniqueItems: true } } } }));
check("the 400 names response_format", badSchema?.param === "response_format", JSON.stringify(badSchema?.error));

// 413: a body over --max-request-body-mb 1.
await expectError("413 on a body over the limit", 413, OpenAI.APIError, () => client.chat.completions.create(
    { model, messages: [{ role: "user", content: "x".repeat(2 << 20) }], max_tokens: 1 }));

// 429 and 503: a stream of two choices holds both generation slots (--max-concurrency 2), one request waits
// in the queue (--max-queued-requests 1) until the queue timeout answers 503, one more meanwhile gets 429.
async function waitingRequests() {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("moeserve:num_requests_waiting{"));
  return line ? Number(line.split(" ").pop()) : -1;
}
const holder = new AbortController();
const hold = await client.completions.create(
    { model, prompt: "Hold the slots", max_tokens: 30000, ignore_eos: true, stream: true, n: 2 },
    { signal: holder.signal });  // returns once the server admitted it (the stream's head is out)
const queued = client.completions.create({ model, prompt: "Wait in the queue", max_tokens: 1 })
                   .then(() => null, (e) => e);
let waiting = 0;
for (let i = 0; i < 500 && waiting < 1; i++) {
  waiting = await waitingRequests();
  if (waiting < 1) await new Promise((r) => setTimeout(r, 10));
}
check("a request waits in the admission queue", waiting === 1, `waiting=${waiting}`);
await expectError("429 when the admission queue is full", 429, OpenAI.RateLimitError,
                  () => client.completions.create({ model, prompt: "One too many", max_tokens: 1 }));
const timedOut = await queued;
check("503 (InternalServerError) on the queue timeout",
      timedOut instanceof OpenAI.InternalServerError && timedOut.status === 503 &&
          /queue timeout/.test(timedOut.message),
      `${timedOut?.constructor?.name} status=${timedOut?.status} ${timedOut?.message}`);
holder.abort();
try {
  for await (const chunk of hold) void chunk;  // ends with the abort
} catch (e) {
  if (!(e instanceof OpenAI.APIUserAbortError) && e?.name !== "AbortError") throw e;
}

console.log(failures === 0 ? "all SDK checks passed" : `${failures} SDK checks failed`);
process.exit(failures === 0 ? 0 : 1);
