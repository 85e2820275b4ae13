"""A local OpenAI-compatible chat endpoint for tests (the teacher's and the judge's clients)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer


def json_endpoint(reply, threaded: bool = False):
    """(server, base url) of a /v1 endpoint on 127.0.0.1 answering each POST's JSON body with `reply(path, headers,
    body) -> (status, payload)`, served from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, payload = reply(self.path, self.headers, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = (ThreadingHTTPServer if threaded else HTTPServer)(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


class FakeChatServer:
    """A local OpenAI-compatible endpoint replying with queued (status, body) pairs."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        self.httpd, self.url = json_endpoint(self._reply)

    def _reply(self, path, headers, body):
        self.requests.append((path, headers.get("Authorization"), body))
        return self.replies.pop(0) if self.replies else (500, {})

    def close(self):
        self.httpd.shutdown()
