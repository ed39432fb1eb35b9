// libFuzzer target for the trace reader (molora::prof::read_trace_buffer): the structural
// scanner that splits traceEvents into pieces, the simdjson piece parser, gzip input. The first
// input byte picks the piece size (tiny pieces exercise every split path) and the thread count;
// the rest is the trace (raw JSON or gzip). Any Status is fine; crashes, sanitizer reports and
// hangs are not. Also checks that the result does not depend on piece size or threads.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "molora/prof.h"
#include "molora/settings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  namespace mp = molora::prof;
  mp::ReadOptions a, b;
  a.threads = 1;
  a.piece_bytes = 256 + (data[0] & 0x3f) * 7;
  b.threads = (data[0] & 0x40) ? 2 : 1;
  b.piece_bytes = 4u << 20;
  mp::Trace ta, tb;
  // Bit 7 reads the second time through zlib instead of the default inflater (ISA-L when built
  // with it): the same verdict and events are expected.
  const bool other_gzip = (data[0] & 0x80) != 0;
  molora::Status sa = mp::read_trace_buffer(data + 1, size - 1, a, &ta);
  if (other_gzip) molora::set_setting("MOLORA_PROF_GZIP", "zlib");
  molora::Status sb = mp::read_trace_buffer(data + 1, size - 1, b, &tb);
  if (other_gzip) molora::set_setting("MOLORA_PROF_GZIP", std::nullopt);
  // The verdict must not depend on piece size or threads: the same status code, and when both
  // succeed the same events kept (tests/data/prof_fuzz_split_divergence.bin was a case where
  // tiny pieces said "truncated" and one piece "backslash outside a string").
  if (sa.code() != sb.code()) std::abort();
  if (sa.ok() && ta.truncated != tb.truncated) std::abort();
  if (sa.ok() &&
      (ta.events != tb.events || ta.kernels.size() != tb.kernels.size() ||
       ta.runtime.size() != tb.runtime.size() || ta.annotations.size() != tb.annotations.size()))
    std::abort();
  return 0;
}
