// tests/oracle/program.cpp: see program.hpp.
#include "oracle/program.hpp"

#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace capalloc::oracle {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kAlloc: return "alloc";
    case OpKind::kFree: return "free";
    case OpKind::kWrite: return "write";
    case OpKind::kRead: return "read";
    case OpKind::kUpdate: return "update";
    case OpKind::kMemset: return "memset";
    case OpKind::kJoin: return "join";
    case OpKind::kCopy: return "memcpy";
  }
  return "?";
}

std::string describe(const Program& p) {
  std::ostringstream out;
  for (std::size_t i = 0; i < p.eager.size(); ++i) {
    out << "  B" << i << " = alloc(" << p.eager[i] << " floats)\n";
  }
  for (std::size_t c = 0; c < p.captures.size(); ++c) {
    const CaptureProgram& cp = p.captures[c];
    out << "  capture g" << c << (cp.shared_pool ? " (shared pool" : " (private pool")
        << (cp.route == Route::kTracker ? ", tracker" : ", native") << ", " << cp.streams
        << " stream(s)):\n";
    for (const Op& op : cp.ops) {
      out << "    s" << op.stream << ": " << op_name(op.kind);
      if (op.kind == OpKind::kJoin) {
        out << " -> s" << op.to << "\n";
        continue;
      }
      out << " B" << op.block;
      if (op.kind == OpKind::kAlloc) out << " (" << op.hi << " floats)";
      if (op.kind != OpKind::kAlloc && op.kind != OpKind::kFree) {
        out << " [" << op.lo << ", " << op.hi << ")";
      }
      out << "\n";
    }
  }
  for (int b : p.free_after) out << "  free B" << b << "\n";
  for (std::size_t s : p.alloc_after) out << "  alloc(" << s << " floats)\n";
  return out.str();
}

namespace {

// Few sizes, mostly small: freed memory is reused often, which is where
// aliasing happens.
constexpr std::size_t kSizes[] = {256, 256, 512, 2048};

}  // namespace

Program generate(std::mt19937_64& rng, const GenerateOptions& options) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  Program p;
  const int eager = 1 + static_cast<int>(pick(3));
  for (int i = 0; i < eager; ++i) p.eager.push_back(kSizes[pick(4)]);
  std::map<int, std::size_t> live;  // block -> floats
  for (int i = 0; i < eager; ++i) live[i] = p.eager[static_cast<std::size_t>(i)];
  int next = eager;
  const int captures = 1 + static_cast<int>(pick(3));
  for (int c = 0; c < captures; ++c) {
    CaptureProgram cp;
    cp.shared_pool = pick(4) != 0;
    cp.route = options.native_captures && pick(4) == 0 ? Route::kNative : Route::kTracker;
    cp.streams = 1 + static_cast<int>(pick(static_cast<std::size_t>(options.max_streams)));
    std::set<int> joined{0};
    std::vector<int> born;
    int recent = -1;  // the block allocated last: used more often
    const int ops = 2 + static_cast<int>(pick(14)) + 2 * (cp.streams - 1);
    for (int k = 0; k < ops; ++k) {
      const std::size_t roll = pick(13);
      // Work goes to a joined stream; a join forks a new one or orders two.
      auto it_stream = joined.begin();
      std::advance(it_stream, static_cast<std::ptrdiff_t>(pick(joined.size())));
      const int stream = *it_stream;
      if (roll >= 10 && roll < 12 && cp.streams > 1) {
        const int to = static_cast<int>(pick(static_cast<std::size_t>(cp.streams)));
        if (to != stream) {
          cp.ops.push_back({OpKind::kJoin, 0, 0, 0, stream, to});
          joined.insert(to);
        }
        continue;
      }
      if (roll < 3 || live.empty()) {
        const std::size_t floats = kSizes[pick(4)];
        cp.ops.push_back({OpKind::kAlloc, next, 0, floats, stream, 0});
        live[next] = floats;
        recent = next;
        born.push_back(next++);
      } else if (roll < 5 && !born.empty()) {
        const std::size_t i = pick(born.size());
        cp.ops.push_back({OpKind::kFree, born[i], 0, 0, stream, 0});
        live.erase(born[i]);
        born.erase(born.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        auto it = live.begin();
        if (recent >= 0 && live.contains(recent) && pick(2) == 0) {
          it = live.find(recent);
        } else {
          std::advance(it, static_cast<std::ptrdiff_t>(pick(live.size())));
        }
        const std::size_t floats = it->second;
        std::size_t lo = pick(floats), hi = pick(floats + 1);
        if (lo > hi) std::swap(lo, hi);
        if (hi == lo) ++hi;  // lo < floats: a range of one float at least
        const OpKind kind = roll < 7    ? OpKind::kWrite
                            : roll < 8  ? OpKind::kMemset
                            : roll < 9  ? OpKind::kRead
                            : roll < 12 ? OpKind::kUpdate
                                        : OpKind::kCopy;
        cp.ops.push_back({kind, it->first, lo, hi, stream, 0});
      }
    }
    p.captures.push_back(std::move(cp));
  }
  for (int i = 0; i < eager; ++i) {
    if (pick(2) == 0) p.free_after.push_back(i);
  }
  const int fresh = static_cast<int>(pick(3));
  for (int i = 0; i < fresh; ++i) p.alloc_after.push_back(kSizes[pick(4)]);
  return p;
}

Program shrink(Program p, const std::function<bool(const Program&)>& fails) {
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::size_t c = 0; c < p.captures.size() && !progress; ++c) {
      for (std::size_t i = 0; i < p.captures[c].ops.size(); ++i) {
        Program q = p;
        q.captures[c].ops.erase(q.captures[c].ops.begin() + static_cast<std::ptrdiff_t>(i));
        if (fails(q)) {
          p = std::move(q);
          progress = true;
          break;
        }
      }
    }
    for (std::size_t c = 0; c < p.captures.size() && !progress; ++c) {
      Program q = p;
      q.captures.erase(q.captures.begin() + static_cast<std::ptrdiff_t>(c));
      if (fails(q)) p = std::move(q), progress = true;
    }
    for (std::size_t i = 0; i < p.free_after.size() && !progress; ++i) {
      Program q = p;
      q.free_after.erase(q.free_after.begin() + static_cast<std::ptrdiff_t>(i));
      if (fails(q)) p = std::move(q), progress = true;
    }
    for (std::size_t i = 0; i < p.alloc_after.size() && !progress; ++i) {
      Program q = p;
      q.alloc_after.erase(q.alloc_after.begin() + static_cast<std::ptrdiff_t>(i));
      if (fails(q)) p = std::move(q), progress = true;
    }
  }
  return p;
}

}  // namespace capalloc::oracle
