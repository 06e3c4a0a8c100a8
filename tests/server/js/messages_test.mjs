// Drives a running `moeserve serve --model demo` through the official Anthropic SDK (@anthropic-ai/sdk):
// messages with text, thinking blocks, a client tool (tool_choice any, then its tool_result), streaming
// through the SDK's MessageStream (which rebuilds the message from the events and parses tool input), and
// countTokens against the usage the same requests report.
// Usage: node messages_test.mjs BASE_URL MODEL API_KEY. Prints one line per check; exits 1 if any failed.
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
let failures = 0;
function check(name, condition, detail = "") {
  console.log(`${condition ? "ok  " : "FAIL"} ${name}${condition ? "" : " " + detail}`);
  if (!condition) failures++;
}
const blocks = (m, type) => m.content.filter((b) => b.type === type);

const thinking = { model, max_tokens: 6, temperature: 0, thinking: { type: "enabled", budget_tokens: 1024 },
                   system: "Be brief.", messages: [{ role: "user", content: "Say hello." }] };
const whole = await client.messages.create(thinking);
check("messages: a message with a thinking block", whole.type === "message" && whole.role === "assistant" &&
      blocks(whole, "thinking").length === 1 && blocks(whole, "thinking")[0].thinking.length > 0,
      JSON.stringify(whole));
check("messages: stop_reason and usage", whole.stop_reason === "max_tokens" && whole.usage.output_tokens === 6 &&
      whole.usage.input_tokens > 0, JSON.stringify(whole));

const stream = client.messages.stream(thinking);
let thinkingDeltas = "";
stream.on("thinking", (delta) => { thinkingDeltas += delta; });
const streamed = await stream.finalMessage();
check("messages stream: thinking from deltas equals the non-streamed thinking",
      blocks(streamed, "thinking")[0]?.thinking === thinkingDeltas && thinkingDeltas === blocks(whole, "thinking")[0].thinking,
      JSON.stringify({ streamed: streamed.content, thinkingDeltas }));

const plain = await client.messages.create({ model, max_tokens: 8, temperature: 0, thinking: { type: "disabled" },
                                             messages: [{ role: "user", content: [{ type: "text", text: "Hi" }] }] });
check("messages: thinking disabled gives text only", blocks(plain, "text").length === 1 &&
      blocks(plain, "thinking").length === 0, JSON.stringify(plain.content));

const weather = { name: "get_weather", description: "Current weather",
                  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } };
const withTool = { model, max_tokens: 24, temperature: 0, tools: [weather], tool_choice: { type: "any" },
                   messages: [{ role: "user", content: "Weather in Paris?" }] };
const toolStream = client.messages.stream(withTool);
const events = new Set();
toolStream.on("streamEvent", (e) => events.add(e.type));
const called = await toolStream.finalMessage();
const use = blocks(called, "tool_use")[0];  // the untrained model may not close the call: max_tokens
check("messages tool stream: a tool_use block with object input", use?.name === "get_weather" &&
      typeof use.input === "object" && ["tool_use", "max_tokens"].includes(called.stop_reason),
      JSON.stringify(called));
check("messages tool stream: its events", ["message_start", "content_block_start", "content_block_delta",
      "content_block_stop", "message_delta", "message_stop"].every((t) => events.has(t)), JSON.stringify([...events]));
const calledWhole = await client.messages.create(withTool);
check("messages tool: the same call whole", JSON.stringify(blocks(calledWhole, "tool_use")[0]?.input) ===
      JSON.stringify(use?.input), JSON.stringify({ whole: calledWhole.content, streamed: called.content }));

const next = await client.messages.create({ model, max_tokens: 4, temperature: 0, tools: [weather], messages: [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: called.content },
  { role: "user", content: [{ type: "tool_result", tool_use_id: use?.id ?? "x", content: "18 C, sunny" }] }] });
check("messages: a tool_result turn is answered", next.type === "message" && next.usage.input_tokens >
      calledWhole.usage.input_tokens, JSON.stringify(next.usage));

// countTokens: the input_tokens the same request's usage reports, with system and thinking, with a forced
// tool (its call's opening is part of the prompt), and over a tool_result turn.
const countOf = async (request) => {
  const { max_tokens, temperature, stream, ...prompt } = request;
  return (await client.messages.countTokens(prompt)).input_tokens;
};
for (const [name, request, answered] of [["system and thinking", thinking, whole], ["a forced tool", withTool, calledWhole]]) {
  const counted = await countOf(request);
  check(`messages.countTokens: ${name} as usage.input_tokens`, counted === answered.usage.input_tokens,
        JSON.stringify({ counted, usage: answered.usage }));
}
const toolResultTurn = { model, max_tokens: 4, tools: [weather], messages: [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: called.content },
  { role: "user", content: [{ type: "tool_result", tool_use_id: use?.id ?? "x", content: "18 C, sunny" }] }] };
const countedTurn = await countOf(toolResultTurn);
check("messages.countTokens: a tool_result turn as usage.input_tokens", countedTurn === next.usage.input_tokens,
      JSON.stringify({ countedTurn, usage: next.usage }));
try {
  await client.messages.countTokens({ model, messages: [] });
  check("messages.countTokens: no messages is a 400", false, "no error");
} catch (e) {
  check("messages.countTokens: no messages is a 400", e instanceof Anthropic.BadRequestError, String(e));
}

try {
  await client.messages.create({ model, max_tokens: 4, messages: [{ role: "user", content: [
    { type: "document", source: { type: "text", media_type: "text/plain", data: "x" } }] }] });
  check("messages: an unsupported block is a 400", false, "no error");
} catch (e) {
  check("messages: an unsupported block is a 400", e instanceof Anthropic.BadRequestError, String(e));
}

console.log(failures === 0 ? "all Messages checks passed" : `${failures} Messages checks failed`);
process.exit(failures === 0 ? 0 : 1);
