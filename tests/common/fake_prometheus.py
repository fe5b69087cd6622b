"""A stand-in for a Prometheus behind TLS and an auth proxy: HTTPS with the certificate and key
given, answering every /api/v1/query with an empty instant vector (Prometheus' present for
`vector(time())`) when the request's Authorization is the one given, and 401 otherwise.
Prints its port once it listens. Arguments: CERT KEY AUTHORIZATION."""

import http.server
import json
import ssl
import sys
import time

CERT, KEY, AUTHORIZATION = sys.argv[1:4]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != AUTHORIZATION:
            self.answer(401, b"Unauthorized\n", "text/plain")
            return
        result = []
        if "vector%28time%28%29%29" in self.path:
            result = [{"metric": {}, "value": [time.time(), str(time.time())]}]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        self.answer(200, json.dumps(body).encode(), "application/json")

    def answer(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
