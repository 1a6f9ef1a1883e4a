// record_server.mjs - a minimal OpenAI-style streaming server that records request bodies.
//
// Usage: node record_server.mjs BODIES_FILE. Listens on a free loopback port and prints
// "port N" on stdout. GET /v1/models names one model; POST /v1/completions and
// /v1/chat/completions append the request body as one JSON line to BODIES_FILE and stream
// max_tokens one-word chunks 5 ms apart, then usage and [DONE]. It lets tests see exactly
// what a client sends, independent of gptoss's own request parser.
import fs from "node:fs";
import http from "node:http";

const bodiesFile = process.argv[2];
const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/v1/models") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ object: "list", data: [{ id: "recorded", object: "model" }] }));
    return;
  }
  let body = "";
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    let parsed;
    try {
      parsed = JSON.parse(body);
    } catch {
      res.writeHead(400).end("bad json");
      return;
    }
    fs.appendFileSync(bodiesFile, JSON.stringify(parsed) + "\n");
    const chat = req.url === "/v1/chat/completions";
    const n = Math.max(1, Math.min(parsed.max_tokens || 1, 64));
    res.writeHead(200, { "content-type": "text/event-stream" });
    let sent = 0;
    const tick = () => {
      if (sent < n) {
        const choice = chat ? { index: 0, delta: { content: " word" } } : { index: 0, text: " word" };
        res.write(`data: ${JSON.stringify({ choices: [choice] })}\n\n`);
        sent++;
        setTimeout(tick, 5);
        return;
      }
      const usage = { prompt_tokens: 8, completion_tokens: n, total_tokens: 8 + n };
      res.write(`data: ${JSON.stringify({ choices: [], usage })}\n\n`);
      res.end("data: [DONE]\n\n");
    };
    tick();
  });
});
server.listen(0, "127.0.0.1", () => console.log(`port ${server.address().port}`));
