"""A stand-in for an OpenAI-compatible completions server, stdlib only, for the serving tests (not collected).

    python -m tests.fake_server --port P [--tokens N] [--per-chunk K] [--delay S] [--crash-after R]
                                [--unhealthy] [--child] [--ignore-term]

GET /health answers 200 (never, with --unhealthy). POST /v1/completions streams ``data:`` events as vLLM does with
``return_token_ids``: N output tokens (token k is prompt[-1] + 1 + k), K per event, one event every S seconds, then a
usage event and ``data: [DONE]``. --crash-after R: the process exits (status 3) when request R+1 arrives, mid-load.
--child: starts a child process in its group that outlives a plain kill of the server (the group stop must take
it); its pid goes to stdout. --ignore-term: SIGTERM is ignored (stop must escalate to SIGKILL).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--per-chunk", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--unhealthy", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); time.sleep(600)"])
        print(f"child {child.pid}", flush=True)
    served = {"n": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path == "/health" and not args.unhealthy:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            else:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                served["n"] += 1
                if args.crash_after is not None and served["n"] > args.crash_after:
                    os._exit(3)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            last = body["prompt"][-1]
            n = min(args.tokens, body["max_tokens"])
            for k in range(0, n, args.per_chunk):
                time.sleep(args.delay)
                ids = [last + 1 + j for j in range(k, min(k + args.per_chunk, n))]
                finish = "length" if k + args.per_chunk >= n else None
                event = {"choices": [{"index": 0, "text": "".join(f"<{i}>" for i in ids), "token_ids": ids,
                                      "finish_reason": finish}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
