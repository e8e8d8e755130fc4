"""tests/report_page_check.py (DOM SNAPSHOT_OR_none TRACE_OR_none arm-a|-)...

Checks report pages (four arguments each; arm-a for seed 003's arm A). For each
page it checks as headless Chromium left it after its script ran
(chromium --dump-dom): the page finished (body[data-ready=yes]); it drew one
block rectangle per block of its inputs, counted here from the inputs
themselves (the trace's allocations with an address, plus the snapshot's
blocks the trace does not name); every finding of the inputs is listed in
the findings table at its address (the overlap's start) and marked in the
drawing at that address; the victim's block is drawn at the victim's
address; a snapshot's audit groups are listed, one row each. With arm-a: seed 003's arm A has a hazard whose address is where
T was and WS now is (the aliasing address), on a block tagged WS.
"""
import json
import sys
from html.parser import HTMLParser


def addr(value):
    return int(value, 16) if isinstance(value, str) else int(value)


class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.body = {}
        self.blocks = []         # attrs of rect.block
        self.finding_rows = []   # attrs of tr.finding
        self.finding_marks = []  # attrs of .finding-mark
        self.audit_rows = 0      # tr.audit-row

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "body":
            self.body = a
        elif tag == "rect" and "block" in classes and "data-seq" in a:
            self.blocks.append(a)
        elif tag == "tr" and "finding" in classes:
            self.finding_rows.append(a)
        elif "finding-mark" in classes:
            self.finding_marks.append(a)
        elif tag == "tr" and "audit-row" in classes:
            self.audit_rows += 1

    handle_startendtag = handle_starttag


def expected_blocks(snapshot, events):
    ids = {e["id"] for e in events if e.get("op") == "alloc" and "addr" in e}
    count = len(ids)
    if snapshot:
        for device in snapshot["devices"]:
            if "pools" in device:
                blocks = [b for p in device["pools"] for s in p["segments"] for b in s["blocks"]
                          if b["state"] != "free"]
            else:
                blocks = device["live_blocks"]
            count += sum(1 for b in blocks if b["sequence"] not in ids)
    return count


def expected_findings(snapshot, events):
    if snapshot and snapshot["findings"]:
        return [(addr(f["overlap"]["begin"]), f["victim"]["sequence"], addr(f["victim"]["ptr"]),
                 f["severity"], f["victim"]["tag"]) for f in snapshot["findings"]]
    return [(addr(e["addr"]), e.get("victim"), None, e["severity"], None)
            for e in events if e.get("op") == "finding"]


def check_page(dom_path, snapshot_path, trace_path, arm_a):
    print(f"== {dom_path}")
    dom = Dom()
    with open(dom_path, encoding="utf-8") as f:
        dom.feed(f.read())
    snapshot = None
    if snapshot_path != "none":
        with open(snapshot_path, encoding="utf-8") as f:
            snapshot = json.load(f)
    events = []
    if trace_path != "none":
        with open(trace_path, encoding="utf-8") as f:
            lines = [json.loads(l) for l in f if l.strip() and not l.lstrip().startswith("#")]
        events = lines[1:]
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    check(dom.body.get("data-ready") == "yes", "the page's script ran to the end (data-ready)")
    want = expected_blocks(snapshot, events)
    check(len(dom.blocks) == want, f"{len(dom.blocks)} block rectangles drawn, {want} blocks in the inputs")
    check(dom.body.get("data-block-count") == str(want), "body[data-block-count] agrees")
    findings = expected_findings(snapshot, events)
    rows = [addr(r["data-addr"]) for r in dom.finding_rows]
    marks = [addr(m["data-addr"]) for m in dom.finding_marks]
    check(len(rows) == len(findings), f"{len(rows)} finding rows listed, {len(findings)} findings in the inputs")
    for at, victim_seq, victim_ptr, severity, tag in findings:
        check(at in rows, f"finding ({severity}) listed at {hex(at)}")
        check(at in marks, f"finding ({severity}) marked in the drawing at {hex(at)}")
        if victim_seq is not None and victim_ptr is not None:
            drawn = [b for b in dom.blocks if b.get("data-seq") == str(victim_seq)]
            check(any(addr(b["data-addr"]) == victim_ptr for b in drawn),
                  f"victim #{victim_seq} ('{tag}') drawn at {hex(victim_ptr)}")
    audit = (snapshot or {}).get("audit")
    if audit is not None:
        groups = audit if isinstance(audit, list) else next(
            (v for v in audit.values() if isinstance(v, list)), [])
        check(dom.audit_rows == len(groups), f"{dom.audit_rows} audit rows listed, {len(groups)} groups in the snapshot")
    if arm_a:
        t_blocks = [b for b in dom.blocks if b.get("data-tag") == "T"]
        ws_blocks = [b for b in dom.blocks if b.get("data-tag") == "WS"]
        check(len(t_blocks) == 1 and len(ws_blocks) == 1, "arm A draws one T and one WS")
        if t_blocks and ws_blocks:
            alias = addr(t_blocks[0]["data-addr"])
            check(alias == addr(ws_blocks[0]["data-addr"]), f"T and WS share {hex(alias)} (the aliasing)")
            hazards = [f for f in findings if f[3] == "hazard" and f[4] == "WS"]
            check(any(f[0] == alias for f in hazards), f"arm A's hazard on WS is at the aliasing address {hex(alias)}")
            check(alias in marks, "and marked there in the drawing")
    if failures:
        print(f"{len(failures)} check(s) failed for {dom_path}")
    return not failures


def main():
    args = sys.argv[1:]
    if not args or len(args) % 4 != 0:
        sys.exit(__doc__)
    ok = True
    for i in range(0, len(args), 4):
        dom_path, snapshot_path, trace_path, flag = args[i:i + 4]
        try:
            ok = check_page(dom_path, snapshot_path, trace_path, flag == "arm-a") and ok
        except (OSError, ValueError, KeyError) as e:
            print(f"FAIL {dom_path}: {e!r}")
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
