// Interop: the official TypeScript ACP SDK's *client* drives `subagents acp-agent`.
//
// Usage: node acp_client.mjs <path-to-subagents>
// (copy it next to a node_modules holding @agentclientprotocol/sdk first: ES modules resolve
// imports relative to the file). Prints one JSON line per check,
//   {"suite":"acp-client","check":"<name>","pass":true|false,"detail":"<short>"}
// and exits 0 when every check passed, 1 otherwise. Every agent process it starts is stopped
// and awaited before it exits.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const bin = process.argv[2];
if (!bin) {
  console.error("usage: node acp_client.mjs <path-to-subagents>");
  process.exit(2);
}
const DEADLINE_MS = 20_000;
// The agents' process cwd and the sessions' cwd (absolute, existing).
const dir = mkdtempSync(join(tmpdir(), "acp-interop-"));
const started = []; // every agent process this script started

/** Spawns `subagents acp-agent` scripted by exactly the ACP_AGENT_* variables in `script`. */
function spawnAgent(script = {}) {
  const env = { ...process.env };
  // An inherited ACP_AGENT_* would change the script (and unknown names are refused).
  for (const name of Object.keys(env)) if (name.startsWith("ACP_AGENT_")) delete env[name];
  const child = spawn(bin, ["acp-agent", "--store", "memory"], {
    cwd: dir,
    env: { ...env, ...script },
    stdio: ["pipe", "pipe", "pipe"],
  });
  const agent = { child, stderr: "" };
  agent.exited = new Promise((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
    child.once("error", (error) => { // e.g. ENOENT: no exit event follows
      agent.spawnError = error.message;
      resolve({ error: error.message });
    });
  });
  child.stderr.on("data", (data) => (agent.stderr = (agent.stderr + data).slice(-300)));
  child.stdin.on("error", () => {}); // EPIPE once the agent is gone: its exit tells the story
  started.push(agent);
  return agent;
}

/** Ends an agent: closes its stdin, SIGKILLs it after `graceMs`; answers how it exited. */
async function stop(agent, graceMs = 3000) {
  agent.child.stdin.end();
  const kill = setTimeout(() => agent.child.kill("SIGKILL"), graceMs);
  const exit = await agent.exited;
  clearTimeout(kill);
  return exit;
}

/** Connects the SDK client to `agent`, initializes, runs `op(ctx, initializeResponse)`. */
function withClient(agent, op) {
  const stream = acp.ndJsonStream(
    Writable.toWeb(agent.child.stdin),
    Readable.toWeb(agent.child.stdout),
  );
  const app = acp
    .client({ name: "subagents-interop" })
    // Updates reach the ActiveSession queues; this handler only marks them handled.
    .onNotification(acp.methods.client.session.update, () => {});
  return app.connectWith(stream, async (ctx) => {
    const init = await ctx.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: {},
    });
    return op(ctx, init);
  });
}

/** A raw (no SDK) reader of the agent's stdout lines: `next(ms)` answers a line or null. */
function lineReader(agent) {
  const queue = [];
  const waiters = [];
  createInterface({ input: agent.child.stdout }).on("line", (line) => {
    const waiter = waiters.shift();
    if (waiter) waiter(line);
    else queue.push(line);
  });
  return (ms) => {
    if (queue.length) return Promise.resolve(queue.shift());
    return new Promise((resolve) => {
      const waiter = (line) => {
        clearTimeout(timer);
        resolve(line);
      };
      const timer = setTimeout(() => {
        waiters.splice(waiters.indexOf(waiter), 1);
        resolve(null);
      }, ms);
      waiters.push(waiter);
    });
  };
}

function expect(condition, detail) {
  if (!condition) throw new Error(detail);
}

/** The JSON-RPC error of a rejected `promise` (it must reject). */
async function rejection(promise) {
  try {
    const result = await promise;
    throw new Error(`expected an error, got ${JSON.stringify(result)}`);
  } catch (error) {
    if (typeof error.code !== "number") throw error;
    return error;
  }
}

function describe(error) {
  if (typeof error?.code === "number")
    return `JSON-RPC ${error.code} ${error.message} ${JSON.stringify(error.data ?? null)}`;
  return String(error?.message ?? error);
}

let failed = 0;

/** Runs one check under its deadline; the agents it started are stopped when it ends. */
async function check(name, run) {
  const first = started.length;
  let timer;
  let pass = false;
  let detail;
  try {
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no result within ${DEADLINE_MS} ms`)), DEADLINE_MS);
    });
    detail = await Promise.race([run(), deadline]);
    pass = true;
  } catch (error) {
    detail = describe(error);
    for (const agent of started.slice(first)) {
      if (agent.spawnError) detail += ` [spawn: ${agent.spawnError}]`;
      if (agent.stderr.trim()) detail += ` [agent stderr: ${agent.stderr.trim()}]`;
    }
  }
  clearTimeout(timer);
  await Promise.all(started.slice(first).map((agent) => stop(agent)));
  if (!pass) failed += 1;
  detail = String(detail).replace(/\s+/g, " ").slice(0, 400);
  console.log(JSON.stringify({ suite: "acp-client", check: name, pass, detail }));
}

await check("initialize", () =>
  withClient(spawnAgent(), (_ctx, init) => {
    expect(init.protocolVersion === 1, `protocolVersion ${JSON.stringify(init.protocolVersion)}`);
    expect(typeof init.agentCapabilities === "object" && init.agentCapabilities !== null,
      `no agentCapabilities in ${JSON.stringify(init)}`);
    return `protocolVersion 1, agentCapabilities ${JSON.stringify(init.agentCapabilities)}`;
  }));

await check("session-new", () =>
  withClient(spawnAgent(), async (ctx) => {
    const session = await ctx.buildSession(dir).start();
    expect(typeof session.sessionId === "string" && session.sessionId.length > 0,
      `sessionId ${JSON.stringify(session.sessionId)}`);
    return `sessionId ${session.sessionId}`;
  }));

await check("prompt", () => {
  const text = "interop answer from subagents";
  return withClient(spawnAgent({ ACP_AGENT_TEXT: text }), async (ctx) => {
    const session = await ctx.buildSession(dir).start();
    const answered = session.prompt("hello");
    const streamed = await session.readText(); // the agent_message_chunk texts, until the stop
    const { stopReason } = await answered;
    expect(stopReason === "end_turn", `stopReason ${stopReason}`);
    expect(streamed === text, `chunks carried ${JSON.stringify(streamed)}`);
    return `end_turn, chunks ${JSON.stringify(streamed)}`;
  });
});

await check("cancel-mid-turn", () =>
  withClient(spawnAgent({ ACP_AGENT_HANG: "1", ACP_AGENT_TEXT: "partial" }), async (ctx) => {
    const session = await ctx.buildSession(dir).start();
    const answered = session.prompt("hold the turn");
    let update;
    do update = await session.nextUpdate();
    while (update.kind === "session_update" && update.update.sessionUpdate !== "agent_message_chunk");
    expect(update.kind === "session_update", `the prompt stopped ${update.stopReason} before a chunk`);
    await ctx.notify(acp.methods.agent.session.cancel, { sessionId: session.sessionId });
    const { stopReason } = await answered;
    expect(stopReason === "cancelled", `stopReason ${stopReason}`);
    return `chunk ${JSON.stringify(update.update.content.text)}, then cancel: cancelled`;
  }));

await check("cancel-before-turn", () =>
  withClient(spawnAgent({ ACP_AGENT_DELAY_MS: "10000" }), async (ctx) => {
    const session = await ctx.buildSession(dir).start();
    const start = performance.now();
    const answered = session.prompt("wait first");
    // Written after the prompt on the same pipe: the agent sees it during the 10 s wait.
    await ctx.notify(acp.methods.agent.session.cancel, { sessionId: session.sessionId });
    const { stopReason } = await answered;
    const ms = Math.round(performance.now() - start);
    expect(stopReason === "cancelled", `stopReason ${stopReason} after ${ms} ms`);
    expect(ms < 3000, `cancelled only after ${ms} ms`);
    return `cancelled after ${ms} ms`;
  }));

await check("two-sessions-concurrent", () =>
  withClient(spawnAgent({ ACP_AGENT_DELAY_MS: "1500" }), async (ctx) => {
    const one = await ctx.buildSession(dir).start();
    const two = await ctx.buildSession(dir).start();
    expect(one.sessionId !== two.sessionId, `both sessions are ${one.sessionId}`);
    const start = performance.now();
    const answers = await Promise.all([one.prompt("first"), two.prompt("second")]);
    const ms = Math.round(performance.now() - start);
    const stops = answers.map((answer) => answer.stopReason);
    expect(stops.every((stop) => stop === "end_turn"), `stopReasons ${stops} after ${ms} ms`);
    expect(ms < 2900, `the pair took ${ms} ms (serialized?)`);
    return `both end_turn in ${ms} ms`;
  }));

await check("relative-cwd", () =>
  withClient(spawnAgent(), async (ctx) => {
    const error = await rejection(
      ctx.request(acp.methods.agent.session.new, { cwd: "relative/dir", mcpServers: [] }));
    expect(error.code === -32602, describe(error));
    return describe(error);
  }));

// Raw frames, no SDK: what the agent answers to bytes no SDK would send.
await check("malformed-frames", async () => {
  const agent = spawnAgent();
  const next = lineReader(agent);
  const answer = async (frame) => {
    agent.child.stdin.write(frame + "\n");
    const line = await next(3000);
    return line === null ? null : JSON.parse(line);
  };
  const outcome = (response) =>
    response === null ? "no answer" : response.error ? response.error.code : "result";
  const notJson = await answer("{this is not json");
  const batch = await answer("[1,2]");
  const badMethod = await answer('{"jsonrpc":"2.0","id":7,"method":42}');
  const init = await answer(JSON.stringify({
    jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: 1, clientCapabilities: {} },
  }));
  const exited = agent.child.exitCode ?? agent.child.signalCode;
  const detail = `not-json -> ${outcome(notJson)}, [1,2] -> ${outcome(batch)}, ` +
    `{"method":42} -> ${outcome(badMethod)}, then initialize -> ${outcome(init)}` +
    (exited !== null ? `, agent exited ${exited}` : "");
  expect(outcome(notJson) === -32700 && outcome(batch) === -32600 &&
    outcome(badMethod) === -32600 && init?.result?.protocolVersion === 1, detail);
  return detail;
});

await check("stdin-closed", async () => {
  const agent = spawnAgent();
  const next = lineReader(agent);
  agent.child.stdin.write(JSON.stringify({
    jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: 1, clientCapabilities: {} },
  }) + "\n");
  expect((await next(10_000)) !== null, "no initialize answer"); // it is up and serving
  const start = performance.now();
  agent.child.stdin.end();
  const exit = await Promise.race([
    agent.exited,
    new Promise((resolve) => setTimeout(() => resolve(null), 5000)),
  ]);
  const ms = Math.round(performance.now() - start);
  expect(exit !== null, "still running 5 s after its stdin closed");
  let gone = false;
  try {
    process.kill(agent.child.pid, 0);
  } catch (error) {
    gone = error.code === "ESRCH";
  }
  expect(gone, `pid ${agent.child.pid} still exists`);
  expect(exit.code === 0, `exited ${JSON.stringify(exit)} after ${ms} ms`);
  return `exited ${JSON.stringify(exit)} ${ms} ms after stdin closed`;
});

// Every agent was stopped by its check; make sure none is left before leaving.
await Promise.all(started.map((agent) => stop(agent)));
const alive = started.filter(
  (a) => a.child.pid !== undefined && a.child.exitCode === null && a.child.signalCode === null);
rmSync(dir, { recursive: true, force: true });
if (alive.length) {
  console.error(`agent processes still running: ${alive.map((a) => a.child.pid)}`);
  process.exit(1);
}
process.exit(failed ? 1 : 0);
