"""HTTP/2 clients for tests/h2.rs, on the Python `h2` library (which nobody here wrote) and
raw frames from `hyperframe`/`hpack` for the attacks. Each command prints one JSON object.

    requests HOST PORT SPEC       streams on one connection; SPEC is a JSON list of
                                  {"method", "path", "headers": [[k, v]..], "body",
                                  "no_authority": true to send no :authority};
                                  prints "reset" on stderr for each stream reset, as it comes
    rapid-reset HOST PORT N PATH  N streams opened and reset at once (CVE-2023-44487)
    continuation-flood HOST PORT N  one HEADERS without END_HEADERS, then N CONTINUATIONs
    settings-flood HOST PORT N    N SETTINGS frames
    ping-flood HOST PORT N        N PING frames
    idle-stream HOST PORT PATH    a POST stream whose body never comes
    idle-connection HOST PORT     a connection that opens no stream
    cancelled-posts HOST PORT N PATH  N POSTs one after the other, each reset (CANCEL) in
                                  the same write as its body's last DATA frame
    reset-on-cue HOST PORT PATH ID  one POST (body and all) with request id ID; prints "sent" on
                                  stderr once it is out, then resets it (CANCEL) when a line
                                  comes on stdin, and prints "reset"
    slow-stream HOST PORT PATH [N]  N GETs (1 unless told) on one connection; prints "sent" on
                                  stderr once they are out and "goaway" when a GOAWAY comes,
                                  then reports the first one's answer, whether the GOAWAY came
                                  first, each stream's answer or reset, and whether the gateway
                                  closed the connection with streams still open
    cross-goaway HOST PORT PATH PING  raw frames: a connection that opens no stream until the
                                  gateway's GOAWAY comes, then at once a GET (it crosses the
                                  GOAWAY on the wire), and after it acks the GOAWAY's PING if
                                  PING is "ack" (never if "no-ack"); prints "goaway" on stderr
                                  then, and reports the answer, the GOAWAYs' last stream ids, and
                                  how long after the answer the gateway closed the connection
"""

import json
import socket
import struct
import sys
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hpack
from hyperframe.frame import (
    ContinuationFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
AUTH = [("x-service-agent-id", "agent-1"), ("x-auth-token", "secret")]
GOAWAY, RST_STREAM, PING, SETTINGS = 0x7, 0x3, 0x6, 0x4


def connect(host, port, timeout=10):
    s = socket.create_connection((host, int(port)))
    s.settimeout(timeout)
    return s


def request_headers(method, path, host, extra=()):
    return [
        (":method", method),
        (":scheme", "http"),
        (":authority", host),
        (":path", path),
    ] + list(extra)


def cmd_requests(host, port, spec):
    spec = json.loads(spec)
    s = connect(host, port)
    # h2 refuses to send a request with no :authority unless told not to check.
    checked = not any(r.get("no_authority") for r in spec)
    c = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8", validate_outbound_headers=checked)
    )
    c.initiate_connection()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    s.sendall(c.data_to_send())
    streams = {}
    for r in spec:
        sid = c.get_next_available_stream_id()
        body = r.get("body", "").encode()
        headers = request_headers(r["method"], r["path"], f"{host}:{port}", [tuple(h) for h in r.get("headers", [])])
        if r.get("no_authority"):
            headers = [h for h in headers if h[0] != ":authority"]
        c.send_headers(sid, headers, end_stream=not body)
        if body:
            window = c.local_flow_control_window(sid)
            c.send_data(sid, body[:window], end_stream=len(body) <= window)
            streams[sid] = {"pending": body[window:]}
        else:
            streams[sid] = {"pending": b""}
        streams[sid].update({"status": None, "headers": {}, "body": b"", "done": False, "reset": None})
        s.sendall(c.data_to_send())
    deadline = time.time() + 20
    while not all(v["done"] for v in streams.values()) and time.time() < deadline:
        data = s.recv(65536)
        if not data:
            break
        for e in c.receive_data(data):
            if isinstance(e, h2.events.ResponseReceived):
                hs = dict(e.headers)
                streams[e.stream_id]["status"] = int(hs[":status"])
                streams[e.stream_id]["headers"] = {k: v for k, v in e.headers if not k.startswith(":")}
            elif isinstance(e, h2.events.DataReceived):
                streams[e.stream_id]["body"] += e.data
                c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, h2.events.StreamEnded):
                streams[e.stream_id]["done"] = True
            elif isinstance(e, h2.events.StreamReset):
                streams[e.stream_id]["done"] = True
                streams[e.stream_id]["reset"] = int(e.error_code)
                print("reset", file=sys.stderr, flush=True)
            elif isinstance(e, h2.events.WindowUpdated):
                for sid, v in streams.items():
                    if v["pending"]:
                        window = min(c.local_flow_control_window(sid), c.max_outbound_frame_size)
                        if window > 0:
                            chunk, v["pending"] = v["pending"][:window], v["pending"][window:]
                            c.send_data(sid, chunk, end_stream=not v["pending"])
        s.sendall(c.data_to_send())
    out = []
    for sid in sorted(streams):
        v = streams[sid]
        out.append({
            "status": v["status"],
            "headers": v["headers"],
            "body": v["body"].decode("utf-8", "replace"),
            "reset": v["reset"],
            "done": v["done"],
        })
    print(json.dumps(out))


def frame(ftype, flags, stream_id, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream_id) + payload


def open_raw(host, port):
    """A connection after the preface and the client's SETTINGS: raw frames from here on."""
    s = connect(host, port)
    s.sendall(PREFACE + SettingsFrame(0).serialize())
    return s


def read_frames(s, until, seconds):
    """Reads frames for up to `seconds`, or until `until(frame_type, payload)` is true.
    Returns (frames seen by type, goaway error code or None, whether the peer closed)."""
    seen, goaway, closed = {}, None, False
    buf = b""
    deadline = time.time() + seconds
    s.settimeout(0.2)
    while time.time() < deadline:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
        if not data:
            closed = True
            break
        buf += data
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            ftype, payload = buf[3], buf[9:9 + length]
            buf = buf[9 + length:]
            seen[ftype] = seen.get(ftype, 0) + 1
            if ftype == GOAWAY:
                goaway = int.from_bytes(payload[4:8], "big")
            if until(ftype, payload):
                return seen, goaway, closed
    return seen, goaway, closed


def cmd_rapid_reset(host, port, n, path):
    s = open_raw(host, port)
    enc = hpack.Encoder()
    headers = request_headers("GET", path, f"{host}:{port}", AUTH)
    burst = b""
    for i in range(int(n)):
        sid = 1 + 2 * i
        burst += HeadersFrame(sid, data=enc.encode(headers), flags=["END_HEADERS", "END_STREAM"]).serialize()
        burst += RstStreamFrame(sid, error_code=8).serialize()  # CANCEL
    try:
        s.sendall(burst)
    except OSError:
        pass
    seen, goaway, closed = read_frames(s, lambda t, p: False, 3)
    print(json.dumps({"goaway": goaway, "closed": closed, "headers_frames": seen.get(0x1, 0)}))


def cmd_continuation_flood(host, port, n):
    s = open_raw(host, port)
    enc = hpack.Encoder()
    block = enc.encode(request_headers("GET", "/api/v1/transaction/t/status", f"{host}:{port}", AUTH))
    frames = HeadersFrame(1, data=block, flags=[]).serialize()
    junk = enc.encode([("x-junk", "y" * 4000)])
    sent = 0
    try:
        s.sendall(frames)
        for _ in range(int(n)):
            s.sendall(ContinuationFrame(1, data=junk, flags=[]).serialize())
            sent += 1
    except OSError:
        pass
    seen, goaway, closed = read_frames(s, lambda t, p: t == GOAWAY, 5)
    print(json.dumps({"goaway": goaway, "closed": closed, "sent": sent}))


def flood(host, port, n, make):
    """Sends `n` frames from `make()` while reading; reports what came back and when the
    gateway closed the connection."""
    s = open_raw(host, port)
    started = time.time()
    result = {"sent": 0}

    def send():
        try:
            for _ in range(int(n)):
                s.sendall(make())
                result["sent"] += 1
        except OSError:
            pass

    writer = threading.Thread(target=send, daemon=True)
    writer.start()
    seen, goaway, closed = read_frames(s, lambda t, p: t == GOAWAY, 30)
    result.update({
        "goaway": goaway,
        "closed": closed,
        "acks": seen.get(PING, 0) + seen.get(SETTINGS, 0),
        "seconds": round(time.time() - started, 2),
    })
    print(json.dumps(result))


def cmd_idle_stream(host, port, path):
    s = connect(host, port, timeout=30)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    s.sendall(c.data_to_send())
    headers = request_headers("POST", path, f"{host}:{port}", AUTH + [("content-type", "application/json")])
    c.send_headers(1, headers, end_stream=False)
    s.sendall(c.data_to_send())
    started = time.time()
    status, body, reset = None, b"", None
    while True:
        data = s.recv(65536)
        if not data:
            break
        done = False
        for e in c.receive_data(data):
            if isinstance(e, h2.events.ResponseReceived):
                status = int(dict(e.headers)[":status"])
            elif isinstance(e, h2.events.DataReceived):
                body += e.data
            elif isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
                if isinstance(e, h2.events.StreamReset):
                    reset = int(e.error_code)
        s.sendall(c.data_to_send())
        if done:
            break
    print(json.dumps({"status": status, "body": body.decode("utf-8", "replace"), "reset": reset,
                      "seconds": round(time.time() - started, 2)}))


def cmd_cancelled_posts(host, port, n, path):
    s = connect(host, port)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    s.sendall(c.data_to_send())
    headers = request_headers("POST", path, f"{host}:{port}", AUTH + [("content-type", "application/json")])
    for _ in range(int(n)):
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, headers, end_stream=False)
        s.sendall(c.data_to_send())
        time.sleep(0.05)
        c.send_data(sid, b'{"business_code":"KYC"}', end_stream=True)
        c.reset_stream(sid)
        s.sendall(c.data_to_send())
        time.sleep(0.05)
    s.close()
    print(json.dumps({"sent": int(n)}))


def cmd_reset_on_cue(host, port, path, request_id):
    s = connect(host, port, timeout=30)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    extra = AUTH + [("content-type", "application/json"), ("x-request-id", request_id)]
    c.send_headers(1, request_headers("POST", path, f"{host}:{port}", extra), end_stream=False)
    c.send_data(1, b'{"business_code":"KYC"}', end_stream=True)
    s.sendall(c.data_to_send())
    print("sent", file=sys.stderr, flush=True)
    sys.stdin.readline()
    c.reset_stream(1, error_code=h2.errors.ErrorCodes.CANCEL)
    s.sendall(c.data_to_send())
    print("reset", file=sys.stderr, flush=True)
    # The connection stays open: only the stream is gone.
    sys.stdin.readline()
    s.close()
    print(json.dumps({"reset": 1}))


def cmd_idle_connection(host, port):
    s = open_raw(host, port)
    started = time.time()
    seen, goaway, closed = read_frames(s, lambda t, p: False, 30)
    print(json.dumps({"goaway": goaway, "closed": closed, "seconds": round(time.time() - started, 2)}))


class Frames:
    """The frames a raw connection receives, as (type, flags, stream id, payload), until its
    peer closes it (`closed` is then set) or the socket's timeout passes."""

    def __init__(self, s):
        self.s, self.closed = s, False

    def __iter__(self):
        buf = b""
        while True:
            try:
                data = self.s.recv(65536)
            except ConnectionResetError:
                data = b""
            except socket.timeout:
                return
            if not data:
                self.closed = True
                return
            buf += data
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                ftype, flags, payload = buf[3], buf[4], buf[9:9 + length]
                sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                buf = buf[9 + length:]
                yield ftype, flags, sid, payload


def new_stream():
    return {"status": None, "body": b"", "reset": None, "done": False}


def note_stream_frame(stream, ftype, flags, payload, dec):
    """Notes in `stream` what a frame of it says: its status, body, reset, and whether it is done."""
    if ftype == RST_STREAM:
        stream["reset"] = int.from_bytes(payload[:4], "big")
        stream["done"] = True
    elif ftype == 0x1:
        stream["status"] = int(dict(dec.decode(payload))[":status"])
        stream["done"] = bool(flags & 0x1)
    elif ftype == 0x0:
        stream["body"] += payload
        stream["done"] = bool(flags & 0x1)


def cmd_slow_stream(host, port, path, n="1"):
    """Raw frames: the `h2` library closes its state at the first GOAWAY, while a graceful
    GOAWAY lets the open streams finish, which is what this checks."""
    s = open_raw(host, port)
    enc, dec = hpack.Encoder(), hpack.Decoder()
    block = enc.encode(request_headers("GET", path, f"{host}:{port}", AUTH))
    ids = [1 + 2 * i for i in range(int(n))]
    s.sendall(b"".join(HeadersFrame(sid, data=block, flags=["END_HEADERS", "END_STREAM"]).serialize() for sid in ids))
    print("sent", file=sys.stderr, flush=True)
    streams = {sid: new_stream() for sid in ids}
    goaway_first = False
    s.settimeout(20)
    frames = Frames(s)
    for ftype, flags, sid, payload in frames:
        if ftype == GOAWAY:
            print("goaway", file=sys.stderr, flush=True)
            goaway_first = goaway_first or streams[1]["status"] is None
        elif ftype == PING and not flags & 0x1:
            s.sendall(PingFrame(0, opaque_data=payload, flags=["ACK"]).serialize())
        elif ftype == SETTINGS and not flags & 0x1:
            s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
        elif sid in streams:
            note_stream_frame(streams[sid], ftype, flags, payload, dec)
        if all(v["done"] for v in streams.values()):
            break
    first = streams[1]
    print(json.dumps({
        "status": first["status"],
        "body": first["body"].decode("utf-8", "replace"),
        "goaway_first": goaway_first,
        "streams": [
            {"status": v["status"], "reset": v["reset"], "done": v["done"]}
            for _, v in sorted(streams.items())
        ],
        "closed_with_streams_open": frames.closed,
    }))


def cmd_cross_goaway(host, port, path, ping):
    """Raw frames: a stream opened as the idle connection's first GOAWAY comes, before its
    PING is acked (`ack`: then acked; `no-ack`: never)."""
    s = open_raw(host, port)
    enc, dec = hpack.Encoder(), hpack.Decoder()
    block = enc.encode(request_headers("GET", path, f"{host}:{port}", AUTH))
    stream = new_stream()
    goaways, answered = [], None
    s.settimeout(20)
    frames = Frames(s)
    for ftype, flags, sid, payload in frames:
        if ftype == GOAWAY:
            if not goaways:
                s.sendall(HeadersFrame(1, data=block, flags=["END_HEADERS", "END_STREAM"]).serialize())
                print("goaway", file=sys.stderr, flush=True)
            goaways.append(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF)
        elif ftype == PING and not flags & 0x1 and (ping == "ack" or not goaways):
            s.sendall(PingFrame(0, opaque_data=payload, flags=["ACK"]).serialize())
        elif ftype == SETTINGS and not flags & 0x1:
            s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
        elif sid == 1:
            note_stream_frame(stream, ftype, flags, payload, dec)
        if stream["done"] and answered is None:
            answered = time.time()
    closed = frames.closed
    print(json.dumps({
        "status": stream["status"],
        "body": stream["body"].decode("utf-8", "replace"),
        "reset": stream["reset"],
        "goaways": goaways,
        "closed_with_stream_open": closed and not stream["done"],
        "closed_after_answer": round(time.time() - answered, 2) if closed and answered else None,
    }))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "requests":
        cmd_requests(*args)
    elif command == "rapid-reset":
        cmd_rapid_reset(*args)
    elif command == "continuation-flood":
        cmd_continuation_flood(*args)
    elif command == "settings-flood":
        flood(*args, make=lambda: SettingsFrame(0, settings={0x3: 100}).serialize())
    elif command == "ping-flood":
        flood(*args, make=lambda: PingFrame(0, opaque_data=b"12345678").serialize())
    elif command == "idle-stream":
        cmd_idle_stream(*args)
    elif command == "idle-connection":
        cmd_idle_connection(*args)
    elif command == "cancelled-posts":
        cmd_cancelled_posts(*args)
    elif command == "reset-on-cue":
        cmd_reset_on_cue(*args)
    elif command == "slow-stream":
        cmd_slow_stream(*args)
    elif command == "cross-goaway":
        cmd_cross_goaway(*args)
    else:
        raise SystemExit(f"unknown command {command}")
