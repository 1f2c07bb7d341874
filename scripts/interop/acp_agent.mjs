// Interop: an ACP *agent* built with the official TypeScript ACP SDK, for subagents'
// AcpProvider to run as `node acp_agent.mjs` (ACP v1 over stdio). The prompt's first text
// block, trimmed, picks the behaviour:
//   complete      chunk "sdk agent answer", end_turn
//   permission    ask session/request_permission (yes/allow_once, no/reject_once), then chunk
//                 "permission: selected <optionId>" or "permission: cancelled", end_turn
//   hang          chunk "partial", hold until session/cancel for the session, cancelled
//   unknown-stop  answer stopReason "banana", which ACP does not define
//   anything else chunk "echo: <text>", end_turn
// Environment: INTEROP_PROTOCOL_VERSION=<n> is the protocolVersion initialize answers;
// INTEROP_PID_FILE=<path> gets this process's pid at start. It exits when stdin closes.
import { writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

if (process.env.INTEROP_PID_FILE) writeFileSync(process.env.INTEROP_PID_FILE, String(process.pid));
const protocolVersion = process.env.INTEROP_PROTOCOL_VERSION
  ? Number(process.env.INTEROP_PROTOCOL_VERSION)
  : acp.PROTOCOL_VERSION;

let sessions = 0;
const hanging = new Map(); // sessionId -> ends its hanging prompt (on session/cancel)

/** Streams `text` to the client as one agent_message_chunk of `sessionId`. */
const say = (client, sessionId, text) =>
  client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  });

async function prompt({ params, client, signal }) {
  const { sessionId } = params;
  const first = params.prompt.find((block) => block.type === "text");
  const text = (first?.text ?? "").trim();
  switch (text) {
    case "complete":
      await say(client, sessionId, "sdk agent answer");
      return { stopReason: "end_turn" };
    case "permission": {
      const { outcome } = await client.request(acp.methods.client.session.requestPermission, {
        sessionId,
        toolCall: { toolCallId: "interop-tool-1", title: "run the interop tool" },
        options: [
          { optionId: "yes", name: "Allow", kind: "allow_once" },
          { optionId: "no", name: "Reject", kind: "reject_once" },
        ],
      });
      const said = outcome.outcome === "selected"
        ? `permission: selected ${outcome.optionId}`
        : "permission: cancelled";
      await say(client, sessionId, said);
      return { stopReason: "end_turn" };
    }
    case "hang": {
      // Registered before the chunk goes out, so a cancel sent right after it is never missed.
      const cancelled = new Promise((resolve) => {
        hanging.set(sessionId, resolve);
        signal.addEventListener("abort", resolve); // connection closed or $/cancel_request
      });
      await say(client, sessionId, "partial");
      await cancelled;
      hanging.delete(sessionId);
      return { stopReason: "cancelled" };
    }
    case "unknown-stop":
      // The SDK sends a handler's response as returned (it validates incoming params, not
      // outgoing results), so this reaches the wire unchanged.
      return { stopReason: "banana" };
    default:
      await say(client, sessionId, `echo: ${text}`);
      return { stopReason: "end_turn" };
  }
}

const connection = acp
  .agent({ name: "subagents-interop-agent" })
  .onRequest(acp.methods.agent.initialize, () => ({
    protocolVersion,
    agentCapabilities: { loadSession: false },
    authMethods: [],
  }))
  .onRequest(acp.methods.agent.session.new, () => ({ sessionId: `sdk-session-${++sessions}` }))
  .onRequest(acp.methods.agent.session.prompt, prompt)
  .onNotification(acp.methods.agent.session.cancel, ({ params }) => {
    hanging.get(params.sessionId)?.();
  })
  .connect(acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));

// The connection closes when stdin does; exit then, whatever is still pending.
await connection.closed;
process.exit(0);
