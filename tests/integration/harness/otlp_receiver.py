"""A loopback OTLP/HTTP profiles receiver for the --otlp tests.

Decodes each request with the official `opentelemetry-proto` package
(installed by `cargo xtask setup` in target/otlp-venv) and writes what it
decoded, resolved through the dictionary, as JSON: OUT_DIR/request-N.json.

    otlp_receiver.py OUT_DIR REFUSE

Answers 503 to the first REFUSE requests (Retry-After absent: the sender's
own backoff), then 200 with an empty ExportProfilesServiceResponse. Prints
`listening PORT` once bound (port chosen by the kernel), then one line per
request: `refused N` or `accepted N PATH` (after the JSON is written), so
the test waits on events, not on time. Serves until stdin closes.
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

OUT_DIR = sys.argv[1]
REFUSE = int(sys.argv[2])
lock = threading.Lock()
seen = {"requests": 0, "accepted": 0}


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(body):
    req = profiles_service_pb2.ExportProfilesServiceRequest.FromString(body)
    d = req.dictionary
    s = d.string_table
    zeros = {
        "string": s[0] == "",
        "mapping": d.mapping_table[0].ByteSize() == 0,
        "location": d.location_table[0].ByteSize() == 0,
        "function": d.function_table[0].ByteSize() == 0,
        "stack": d.stack_table[0].ByteSize() == 0,
        "attribute": d.attribute_table[0].ByteSize() == 0,
    }

    def frames(stack_index):
        names = []
        for li in d.stack_table[stack_index].location_indices:
            loc = d.location_table[li]
            for line in loc.lines:
                names.append(s[d.function_table[line.function_index].name_strindex])
        return names

    resources = []
    for rp in req.resource_profiles:
        attrs = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        profiles = []
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                profiles.append({
                    "scope": sp.scope.name,
                    "sample_type": s[p.sample_type.type_strindex],
                    "unit": s[p.sample_type.unit_strindex],
                    "period_type": [s[p.period_type.type_strindex], s[p.period_type.unit_strindex]],
                    "period": p.period,
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "samples": [
                        {"frames": frames(x.stack_index), "values": list(x.values)}
                        for x in p.samples
                    ],
                })
        resources.append({"attributes": attrs, "profiles": profiles})
    return {"zero_entries": zeros, "resources": resources}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with lock:
            seen["requests"] += 1
            n = seen["requests"]
        if n <= REFUSE:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            print(f"refused {n}", flush=True)
            return
        decoded = decode(body)
        decoded["path"] = self.path
        decoded["content_type"] = self.headers.get("Content-Type")
        decoded["headers"] = {k.lower(): v for k, v in self.headers.items()}
        with lock:
            seen["accepted"] += 1
            a = seen["accepted"]
        path = os.path.join(OUT_DIR, f"request-{a}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(decoded, f)
        os.rename(path + ".tmp", path)
        reply = profiles_service_pb2.ExportProfilesServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        print(f"accepted {a} {self.path}", flush=True)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"listening {server.server_address[1]}", flush=True)
sys.stdin.read()
server.shutdown()
