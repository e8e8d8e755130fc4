// tests/trace_reader_test.cpp: the trace reader of `capalloc bench`
// (tools/trace/trace_reader.hpp): what it decodes, and each refusal naming
// the file and the line (docs/trace.md).
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "tools/trace/trace_reader.hpp"

namespace {

using capalloc::trace::OpKind;
using capalloc::trace::parse_trace;

const std::string kHeader = R"({"format": "capalloc.trace/1", "source": "test", "devices": 1})";

absl::StatusOr<capalloc::trace::Trace> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_trace(in, "t.jsonl");
}

// The error of `text`, which must be refused.
std::string refusal(const std::string& text) {
  auto trace = parse(text);
  REQUIRE_FALSE(trace.ok());
  return std::string(trace.status().message());
}

}  // namespace

TEST_CASE("a trace decodes into dense slots, streams and pools") {
  auto trace = parse(kHeader + "\n"
                     "# a comment, then a blank line\n"
                     "\n"
                     R"({"op": "alloc", "id": 70, "size": 100, "stream": 0, "tag": "x", "t": 5})" "\n"
                     R"({"op": "alloc", "id": 71, "size": 300, "stream": 9})" "\n"
                     R"({"op": "record_stream", "id": 70, "stream": 9})" "\n"
                     R"({"op": "free", "id": 70})" "\n"
                     R"({"op": "alloc", "id": 72, "size": 50, "stream": 0, "future_member": [1]})" "\n"
                     R"({"op": "capture_begin", "capture": 4, "stream": 9, "pool": "p"})" "\n"
                     R"({"op": "alloc", "id": 73, "size": 8, "stream": 9})" "\n"
                     R"({"op": "capture_end", "capture": 4})" "\n"
                     R"({"op": "replay", "capture": 4})" "\n"
                     R"({"op": "graph_destroy", "capture": 4})" "\n"
                     // A release of no memory names neither id nor addr.
                     R"({"op": "release", "t": 9, "stream": 0})" "\n"
                     R"({"op": "release_done", "t": 10})" "\n"
                     R"({"op": "finding", "severity": "hazard", "addr": "0x1", "size": 1, "graph": 1})" "\n");
  REQUIRE(trace.ok());
  CHECK(trace->source == "test");
  CHECK(trace->allocs == 4);
  CHECK(trace->frees == 1);
  CHECK(trace->operations() == 5);
  CHECK(trace->slots == 3);  // id 72 reuses the slot id 70 freed
  CHECK(trace->peak_requested_bytes == 400);
  CHECK(trace->stream_ids == std::vector<std::uint64_t>{0, 9});
  CHECK(trace->pools == std::vector<std::string>{"p"});
  CHECK(trace->captures == 1);
  CHECK(trace->replays == 1);
  CHECK(trace->live_at_end.size() == 3);
  REQUIRE(trace->ops.size() == 10);
  CHECK(trace->ops[1].stream == 1);
  CHECK(trace->ops[2].kind == OpKind::kRecordStream);
  CHECK(trace->ops[3].size == 100);  // a free carries its block's size
  CHECK(trace->ops[4].index == trace->ops[0].index);
  CHECK(trace->ops[5].kind == OpKind::kCaptureBegin);
  CHECK(trace->ops[5].pool == 0);
  // Each event's line, for a replay's messages (comments and blank lines count).
  CHECK(trace->op_lines == std::vector<std::uint32_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
}

TEST_CASE("a free of an unknown id is refused, naming the line") {
  const std::string error = refusal(kHeader + "\n" R"({"op": "free", "id": 5})" "\n");
  CHECK_THAT(error, Catch::Contains("t.jsonl:2:"));
  CHECK_THAT(error, Catch::Contains("free of id 5, which is not live"));
}

TEST_CASE("a double free and a record_stream after the free are refused") {
  const std::string twice = kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8, "stream": 0})" "\n"
                            R"({"op": "free", "id": 1})" "\n";
  CHECK_THAT(refusal(twice + R"({"op": "free", "id": 1})"), Catch::Contains("t.jsonl:4: free of id 1"));
  CHECK_THAT(refusal(twice + R"({"op": "record_stream", "id": 1, "stream": 2})"),
             Catch::Contains("t.jsonl:4: record_stream of id 1"));
}

TEST_CASE("an alloc of a live id is refused, naming the line") {
  const std::string error = refusal(kHeader + "\n"
                                    R"({"op": "alloc", "id": 3, "size": 8, "stream": 0})" "\n"
                                    R"({"op": "alloc", "id": 3, "size": 16, "stream": 0})" "\n");
  CHECK_THAT(error, Catch::Contains("t.jsonl:3:"));
  CHECK_THAT(error, Catch::Contains("alloc of id 3, which is live"));
}

TEST_CASE("an alloc of size 0 is refused, naming the line") {
  const std::string error =
      refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 0, "stream": 0})" "\n");
  CHECK_THAT(error, Catch::Contains("t.jsonl:2:"));
  CHECK_THAT(error, Catch::Contains("size 0 (must be > 0)"));
}

TEST_CASE("a line that is not JSON is refused, naming the line") {
  const std::string error = refusal(kHeader + "\n"
                                    R"({"op": "alloc", "id": 1, "size": 8, "stream": 0})" "\n"
                                    R"({"op": "free", "id": 1)" "\n");
  CHECK_THAT(error, Catch::Contains("t.jsonl:3: not valid JSON"));
  CHECK_THAT(refusal(kHeader + "\n[1, 2]\n"), Catch::Contains("t.jsonl:2: not a JSON object"));
  // The parser's reason is passed on: here, bytes that are not UTF-8.
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8, "stream": 0, "tag": ")"
                     "\xff\xfe\"}\n"),
             Catch::Contains("t.jsonl:2: not valid JSON (") && Catch::Contains("UTF-8"));
}

TEST_CASE("a missing or wrong header is refused") {
  CHECK_THAT(refusal(R"({"op": "free", "id": 1})"), Catch::Contains("t.jsonl:1: the first object must be the header"));
  CHECK_THAT(refusal(R"({"format": "capalloc.trace/2"})"), Catch::Contains("is not \"capalloc.trace/1\""));
  CHECK_THAT(refusal("# only a comment\n"), Catch::Contains("t.jsonl: no header"));
}

TEST_CASE("ill-typed members, unknown ops and other devices are refused") {
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": "8", "stream": 0})"),
             Catch::Contains("t.jsonl:2: member \"size\" must be an integer"));
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8})"),
             Catch::Contains("t.jsonl:2: member \"stream\" is missing"));
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "resize", "id": 1})"),
             Catch::Contains("t.jsonl:2: unknown op \"resize\""));
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8, "stream": 0, "device": 1})"),
             Catch::Contains("t.jsonl:2: device 1"));
}

TEST_CASE("a stream is any unsigned 64-bit handle, kNoStream included, and a negative one is refused") {
  // capalloc writes kNoStream (2^64 - 1) for a live block of a destroyed
  // stream's segment when a trace starts: its own traces must read back.
  auto trace = parse(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8, "stream": 18446744073709551615})"
                               "\n" R"({"op": "alloc", "id": 2, "size": 8, "stream": 140737488355328})"
                               "\n" R"({"op": "free", "id": 1})");
  REQUIRE(trace.ok());
  CHECK(trace->stream_ids ==
        std::vector<std::uint64_t>{0, 18446744073709551615ull, 140737488355328ull});
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8, "stream": -3})"),
             Catch::Contains("t.jsonl:2: stream -3 is negative"));
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "alloc", "id": 1, "size": 8, "stream": 1.5})"),
             Catch::Contains("t.jsonl:2: member \"stream\" must be an integer"));
}

TEST_CASE("capture events out of order are refused, naming the line") {
  const std::string begin = kHeader + "\n" R"({"op": "capture_begin", "capture": 1, "stream": 1})" "\n";
  CHECK_THAT(refusal(kHeader + "\n" R"({"op": "capture_end", "capture": 1})"),
             Catch::Contains("t.jsonl:2: capture_end of capture 1, which was never begun"));
  CHECK_THAT(refusal(begin + R"({"op": "replay", "capture": 1})"),
             Catch::Contains("t.jsonl:3: replay of capture 1, which is still capturing"));
  CHECK_THAT(refusal(begin + R"({"op": "capture_end", "capture": 1})" "\n"
                     R"({"op": "capture_begin", "capture": 1, "stream": 2})"),
             Catch::Contains("t.jsonl:4: capture 1 is begun twice"));
  CHECK_THAT(refusal(begin + R"({"op": "capture_begin", "capture": 2, "stream": 1})"),
             Catch::Contains("t.jsonl:3: capture 2 begins on stream 1, which capture 1 is still capturing"));
  CHECK_THAT(refusal(begin), Catch::Contains("capture 1 never ends"));
  // The default stream cannot be captured: refused here, not in the replay.
  CHECK_THAT(refusal(kHeader + "\n# a comment\n" R"({"op": "capture_begin", "capture": 9, "stream": 0})"),
             Catch::Contains("t.jsonl:3: capture 9 begins on stream 0, the default stream"));
  CHECK_THAT(refusal(begin + R"({"op": "capture_end", "capture": 1})" "\n"
                     R"({"op": "graph_destroy", "capture": 1})" "\n" R"({"op": "replay", "capture": 1})"),
             Catch::Contains("t.jsonl:5: replay of capture 1, which is destroyed"));
}
