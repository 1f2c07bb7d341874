#!/usr/bin/env python3
"""An OTLP/HTTP receiver that reads each export and answers 200 with nothing kept: the far end
of `--otlp-endpoint` when what is measured is what exporting costs the exporting process.

    scripts/otlp-sink.py [PORT]          # listens on 127.0.0.1:PORT (4318 by default)

On a machine whose cores the measured run also uses, the receiver's own work is counted as
the export's cost. To take it out of the run's way, as a collector on another machine would
be, put its scheduling group at the lowest priority (Linux schedules a session's processes as
one group, so the receiver's own nice value does not do it):

    scripts/otlp-sink.py & echo 19 > /proc/$!/autogroup
"""

import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
