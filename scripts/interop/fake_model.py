#!/usr/bin/env python3
"""A fake model endpoint on 127.0.0.1 for scripts/interop.sh: the real Codex and Claude Code
products are pointed at it, so they run end to end with no credential and no network.

It speaks just enough of two wires:
  - OpenAI Responses (`POST …/v1/responses`, streamed as server-sent events), for Codex;
  - Anthropic Messages (`POST …/v1/messages`, streamed or not), for Claude Code.

The first path segment picks the behaviour, so one server serves every check:
  /ok/…            answers "interop answer"
  /unauthorized/…  answers 401 with the wire's own error body
  /hang/…          starts the stream and holds it open until the client goes away
  /tool/…          asks for a shell command (`touch interop-marker` in the session's cwd), then
                   answers "tool said: <what the product told the model about it>"

Every request is appended to --log as one JSON line (method, path, status), so a failing check
can be read afterwards. The chosen port is written to --port-file once the server listens.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = "interop answer"
HANG_SECONDS = 120

OPENAI_401 = {
    "error": {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
}
ANTHROPIC_401 = {
    "type": "error",
    "error": {"type": "authentication_error", "message": "invalid x-api-key"},
}


def responses_events(text):
    """The Responses API's events for one assistant message."""
    item = {
        "type": "message",
        "role": "assistant",
        "id": "msg_interop",
        "content": [{"type": "output_text", "text": text}],
    }
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    }
    return [
        {"type": "response.created", "response": {"id": "resp_interop"}},
        {"type": "response.output_item.added", "item": {**item, "content": []}},
        {
            "type": "response.output_text.delta",
            "item_id": "msg_interop",
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        },
        {"type": "response.output_item.done", "item": item},
        {
            "type": "response.completed",
            "response": {"id": "resp_interop", "usage": usage},
        },
    ]


MARKER_COMMAND = "touch interop-marker"


def responses_tool_call():
    """The Responses API's events for one `exec_command` call (Codex's shell tool)."""
    call = {
        "type": "function_call",
        "id": "fc_interop",
        "call_id": "call_interop",
        "name": "exec_command",
        "arguments": json.dumps({"cmd": MARKER_COMMAND}),
    }
    usage = {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}
    return [
        {"type": "response.created", "response": {"id": "resp_tool"}},
        {"type": "response.output_item.done", "item": call},
        {"type": "response.completed", "response": {"id": "resp_tool", "usage": usage}},
    ]


def tool_said(body):
    """What the product sent back for the tool call, or None before it was made."""
    for item in body.get("input") or []:  # Responses
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            output = item.get("output")
            return output if isinstance(output, str) else json.dumps(output)
    for msg in body.get("messages") or []:  # Messages
        for block in msg.get("content") if isinstance(msg.get("content"), list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = " ".join(b.get("text", "") for b in content)
                return str(content)
    return None


def messages_tool_call(model):
    """The Messages API's stream events for one `Bash` tool use (Claude Code's shell tool)."""
    arguments = json.dumps({"command": MARKER_COMMAND, "description": "Create a marker file"})
    return messages_stream(
        model,
        {"type": "tool_use", "id": "toolu_interop", "name": "Bash", "input": {}},
        {"type": "input_json_delta", "partial_json": arguments},
        "tool_use",
    )


def message(model, text):
    return {
        "id": "msg_interop",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }


def messages_events(model, text):
    """The Messages API's stream events for one text answer."""
    return messages_stream(
        model,
        {"type": "text", "text": ""},
        {"type": "text_delta", "text": text},
        "end_turn",
    )


def messages_stream(model, block, delta, stop_reason):
    """The Messages API's stream events for one content block, its one delta, and the stop."""
    start = {**message(model, ""), "content": [], "stop_reason": None}
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 2},
        },
        {"type": "message_stop"},
    ]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_lock = threading.Lock()

    def log_message(self, *_):
        pass  # the JSON log below replaces the default stderr lines

    def record(self, status, body=None):
        entry = {"method": self.command, "path": self.path, "status": status}
        if body is not None:
            entry["model"] = body.get("model")
            entry["stream"] = body.get("stream")
        with self.log_lock, open(self.server.log_path, "a") as log:
            log.write(json.dumps(entry) + "\n")

    def send_json(self, status, value, body=None):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        if status == 401:
            # The Stainless clients (Claude Code's among them) honour this: a refused key is
            # not retried for minutes with backoff.
            self.send_header("x-should-retry", "false")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.record(status, body)

    def stream(self, events, hang, body):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.record(200, body)
        # A held stream sends its opening event only, then nothing until the client leaves.
        for event in events[:1] if hang else events:
            frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
            self.wfile.write(frame.encode())
            self.wfile.flush()
        if hang:
            deadline = time.monotonic() + HANG_SECONDS
            while time.monotonic() < deadline:
                time.sleep(0.2)
                try:  # an SSE comment: fails once the client has closed the connection
                    self.wfile.write(b": held\n\n")
                    self.wfile.flush()
                except OSError:
                    return
        self.close_connection = True

    def do_GET(self):
        # Model listings and anything else a product asks for at start: an empty list.
        self.send_json(200, {"object": "list", "data": [], "models": []})

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        mode = self.path.strip("/").split("/", 1)[0]
        route = self.path.split("?", 1)[0]
        anthropic = "/v1/messages" in route
        if mode == "unauthorized":
            return self.send_json(401, ANTHROPIC_401 if anthropic else OPENAI_401, body)
        if route.endswith("/count_tokens"):
            return self.send_json(200, {"input_tokens": 10}, body)
        answer = ANSWER
        if mode == "tool":
            said = tool_said(body)
            answer = None if said is None else f"tool said: {said}"
        if anthropic:
            model = body.get("model", "claude-interop")
            if not body.get("stream"):
                return self.send_json(200, message(model, answer or ANSWER), body)
            if answer is None:
                return self.stream(messages_tool_call(model), False, body)
            return self.stream(messages_events(model, answer), mode == "hang", body)
        if route.endswith("/responses"):
            if answer is None:
                return self.stream(responses_tool_call(), False, body)
            return self.stream(responses_events(answer), mode == "hang", body)
        self.send_json(404, {"error": {"message": f"no route {route}"}}, body)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.log_path = args.log
    with open(args.port_file, "w") as port_file:
        port_file.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
