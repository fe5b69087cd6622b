"""REDbot, Mark Nottingham's HTTP linter, on a list of requests (its library, not its command
line, which can only GET a URL): reads a JSON list of {"url", "method", "headers", "body"} on
stdin, checks them all at once, and prints a JSON list of {"url", "status", "notes"}, each note
{"id", "level", "summary"} (sub-notes included), in the order given."""

import json
import sys
from configparser import ConfigParser

import thor
from redbot.resource import HttpResource


def notes_of(note_list):
    out = []
    for note in note_list:
        out.append({"id": note.__class__.__name__, "level": note.level.name, "summary": note.summary})
        out.extend(notes_of(getattr(note, "subnotes", []) or []))
    return out


def main():
    requests = json.load(sys.stdin)
    parser = ConfigParser()
    parser.read_dict({"redbot": {"enable_local_access": "True"}})
    config = parser["redbot"]
    results = [None] * len(requests)
    left = [len(requests)]

    def start(i, req):
        resource = HttpResource(config)
        resource.set_request(
            req["url"],
            req.get("method", "GET"),
            [tuple(h) for h in req.get("headers", [])],
            req.get("body", "").encode("utf-8"),
        )

        @thor.events.on(resource)
        def check_done():
            response = resource.response
            results[i] = {
                "url": req["url"],
                "status": response.status_code,
                "notes": notes_of(response.notes),
            }
            left[0] -= 1
            if left[0] == 0:
                thor.stop()

        resource.check()

    for i, req in enumerate(requests):
        start(i, req)
    thor.run()
    json.dump(results, sys.stdout)


main()
