"""A local OpenAI-compatible chat endpoint for tests (the teacher's and the judge's clients)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class FakeChatServer:
    """A local OpenAI-compatible endpoint replying with queued (status, body) pairs."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((self.path, self.headers.get("Authorization"), json.loads(body)))
                status, payload = outer.replies.pop(0) if outer.replies else (500, {})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
