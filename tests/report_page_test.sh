#!/usr/bin/env bash
# tests/report_page_test.sh CAPALLOC OUT_DIR PYTHON: the visual report
# (docs/report.md) rendered in headless Chromium. Writes the reports of
# `capalloc arms --report`, `capalloc gemm-scenario --report`, a hand-written
# event trace, a snapshot alone and a snapshot with an audit section; renders
# each page, keeps a screenshot of it (OUT_DIR/*.png) and checks the DOM the
# page's script left (tests/report_page_check.py): every block drawn, every
# finding listed and marked at its address, arm A's finding at the aliasing
# address, the audit's groups listed.
# Exit 77 (skipped) when no Chromium is installed: scripts/install-deps.sh
# installs Debian's `chromium`, so CI always runs it.
set -uo pipefail
capalloc=$1 out=$2 python=$3
here=$(cd "$(dirname "$0")" && pwd)
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$browser" ]]; then
  echo "SKIP: no chromium (scripts/install-deps.sh installs it)"
  exit 77
fi
rm -rf "$out" && mkdir -p "$out" || exit 1
export CAPALLOC_RUNTIME=host CAPALLOC_LOG_LEVEL=error
failed=0
fail() { echo "FAIL: $*"; failed=1; }

echo "scenarios: $(date +%T)"
"$capalloc" arms --report "$out/arms" >"$out/arms.txt" || fail "capalloc arms --report"
"$capalloc" gemm-scenario --report "$out/gemm" >"$out/gemm.txt" || fail "capalloc gemm-scenario --report"

# A trace as the library's event trace writes it (docs/trace.md): a graph
# pool named by its capture, a block freed in the capture and its memory
# handed to another, a replay and the finding, with addresses.
cat >"$out/hand.trace.jsonl" <<'TRACE'
{"format": "capalloc.trace/1", "source": "tests/report_page_test.sh", "devices": 1}
# comment lines and blank lines are skipped

{"op": "alloc", "id": 1, "size": 1048576, "stream": 0, "tag": "src", "addr": "0x7f0000000000", "t": 100}
{"op": "alloc", "id": 2, "size": 4096, "stream": 0, "tag": "kv", "lifetime": "persistent", "addr": "0x7f0000100000", "t": 200}
{"op": "capture_begin", "capture": 1, "stream": 5, "pool": "shared", "label": "decode", "t": 300}
{"op": "alloc", "id": 3, "size": 1048576, "stream": 5, "tag": "T", "addr": "0x7f1000000000", "t": 400}
{"op": "record_stream", "id": 3, "stream": 7, "t": 450}
{"op": "free", "id": 3, "t": 500}
{"op": "alloc", "id": 4, "size": 1048576, "stream": 5, "tag": "WS", "addr": "0x7f1000000000", "t": 600}
{"op": "capture_end", "capture": 1, "t": 700}
{"op": "finding", "severity": "hazard", "addr": "0x7f1000000000", "size": 1048576, "graph": 1, "victim": 4, "writer": 3, "message": "decode writes WS through T", "t": 750}
{"op": "replay", "capture": 1, "t": 800}
{"op": "free", "id": 1, "t": 900}
{"op": "replay", "capture": 1, "t": 1000}
TRACE
"$capalloc" report "$out/hand.trace.jsonl" -o "$out/hand.html" >/dev/null || fail "capalloc report (trace)"
"$capalloc" report "$out/arms/arm-A.snapshot.json" -o "$out/arm-A-snapshot-only.html" >/dev/null ||
  fail "capalloc report (snapshot alone)"
# A snapshot with an audit section (the retention audit's live_since groups).
"$python" - "$out/arms/arm-A.snapshot.json" "$out/audit.snapshot.json" <<'PY' || fail "writing the audit snapshot"
import json, sys
snapshot = json.load(open(sys.argv[1]))
snapshot["audit"] = {"checkpoint": 1, "live_since": [
    {"tag": "decoder.layer3", "site": "model.py:42 (forward)", "bytes": 1048576, "count": 2},
    {"tag": "", "site": "launch.py:7", "bytes": 512, "count": 1}]}
json.dump(snapshot, open(sys.argv[2], "w"))
PY
"$capalloc" report "$out/arms/arm-A.trace.jsonl" "$out/audit.snapshot.json" -o "$out/audit.html" >/dev/null ||
  fail "capalloc report (trace and snapshot with an audit)"

# A file that is neither is refused, naming it.
echo '[1, 2]' >"$out/bad.json"
err=$("$capalloc" report "$out/bad.json" -o "$out/bad.html" 2>&1)
[[ $? -eq 1 && "$err" == *bad.json*"neither a capalloc snapshot"* ]] || fail "a bad input: $err"

# Every page rendered in one headless Chromium (tests/report_page_render.py):
# NAME.dom.html (the DOM after the page's script ran) and NAME.png.
pages=()
for arm in A B C D; do pages+=("arm-$arm=$out/arms/arm-$arm.html"); done
for arm in status_quo capalloc; do pages+=("gemm-$arm=$out/gemm/gemm-$arm.html"); done
pages+=("hand=$out/hand.html" "arm-A-snapshot-only=$out/arm-A-snapshot-only.html" "audit=$out/audit.html")
echo "chromium: $(date +%T)"
timeout 120 "$python" "$here/report_page_render.py" "$browser" "$out" "${pages[@]}" ||
  fail "rendering in chromium"

# The DOM checks, against the inputs: DOM SNAPSHOT TRACE arm-a|- per page.
checks=()
for arm in A B C D; do
  flag=-
  [[ $arm == A ]] && flag=arm-a
  checks+=("$out/arm-$arm.dom.html" "$out/arms/arm-$arm.snapshot.json" "$out/arms/arm-$arm.trace.jsonl" $flag)
done
for arm in status_quo capalloc; do
  checks+=("$out/gemm-$arm.dom.html" "$out/gemm/gemm-$arm.snapshot.json" "$out/gemm/gemm-$arm.trace.jsonl" -)
done
checks+=("$out/hand.dom.html" none "$out/hand.trace.jsonl" -)
checks+=("$out/arm-A-snapshot-only.dom.html" "$out/arms/arm-A.snapshot.json" none -)
checks+=("$out/audit.dom.html" "$out/audit.snapshot.json" "$out/arms/arm-A.trace.jsonl" arm-a)
"$python" "$here/report_page_check.py" "${checks[@]}" || fail "DOM checks"
for page in "${pages[@]}"; do
  [[ -s "$out/${page%%=*}.png" ]] || fail "${page%%=*}: no screenshot"
  # Self-contained: no URL but the SVG namespace, no external script or link.
  urls=$(grep -Eo "https?://[^\"' )]*" "${page#*=}" | grep -vx 'http://www.w3.org/2000/svg')
  [[ -z "$urls" ]] || fail "${page%%=*}: refers to $urls"
  grep -Eq '<script[^>]* src=|<link[^>]* href=' "${page#*=}" && fail "${page%%=*}: loads a file"
done

echo "done: $(date +%T)"
((failed == 0)) && echo "all report pages rendered and checked; screenshots in $out"
exit $failed
