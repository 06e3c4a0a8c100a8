// Renders chat-template cases with @huggingface/jinja (a second, independent Jinja implementation).
// Usage: node jinja_oracle.mjs CASES.json  ->  prints a JSON array of {"rendered": ...} or {"error": ...}.
// CASES.json: {"template": "...", "cases": [{variables}, ...]}.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const require = createRequire(resolve(".cache/npm-oracles/package.json"));
const { Template } = require("@huggingface/jinja");

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const template = new Template(input.template);
const out = input.cases.map((vars) => {
  try {
    return { rendered: template.render(vars) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});
process.stdout.write(JSON.stringify(out));
