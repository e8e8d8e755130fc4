#!/usr/bin/env python3
"""Renders `capalloc bench --json` output as the Markdown tables of
docs/performance.md, so that the document is refreshed from a run rather than
retyped.

  capalloc bench --json TRACE... > bench.json
  tools/trace/bench_table.py bench.json
"""

import json
import os
import sys


def num(value, digits=1, suffix=""):
    return "n/a" if value is None else "%.*f%s" % (digits, value, suffix)


def render(result):
    lines = []
    m = result["machine"]
    lines.append("%d repetition(s); %d CPUs, %s, %s, %s build." % (
        result["repetitions"], m["nproc"], m["cpu"], m["compiler"], m["build_type"]))
    lines.append("")
    lines.append("| trace | allocator | ns/op median | ns/op p99 | mean | cpu | time vs capalloc | "
                 "peak reserved / peak requested |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    notes = []
    for trace in result["traces"]:
        name = os.path.basename(trace["path"])
        for r in trace["results"]:
            if r["status"] != "ok":
                continue
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, r["allocator"], num(r["ns_per_op_median"]), num(r["ns_per_op_p99"]),
                num(r["ns_per_op_mean"]), num(r["cpu_ns_per_op"]),
                num(r["time_vs_capalloc"], 2, "x"), num(r["peak_reserved_over_requested"], 3)))
            c = r.get("captures")
            if c:
                pools = ", ".join("%s %.2f GiB" % (p["name"], p["reserved_bytes_peak"] / 2**30)
                                  for p in c["pools"])
                notes.append("%s: capalloc %s ns/op inside captures, %s outside (%s); "
                             "capture_end %s ms in all for %d captures; replay %s us each; "
                             "graph pool peak reserved: %s" % (
                                 name, num(c["ns_per_op_inside"]), num(c["ns_per_op_outside"]),
                                 num(c["inside_over_outside"], 2, "x"),
                                 num(c["capture_end_ms_total"], 2), trace["captures"],
                                 num(c["replay_us_each"], 1), pools))
        s = trace["summary"]
        if "fastest_host_allocator" in s:
            notes.append("%s: capalloc / fastest host allocator: %s by ns/op median (%s), %s by "
                         "cpu (%s); naive / capalloc %s" % (
                             name, num(s.get("capalloc_over_fastest"), 2, "x"),
                             s["fastest_host_allocator"],
                             num(s.get("capalloc_over_fastest_by_cpu"), 2, "x"),
                             s.get("fastest_host_allocator_by_cpu"),
                             num(s.get("naive_over_capalloc"), 1, "x")))
    lines.append("")
    lines += ["- " + n for n in notes]
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        print(render(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
