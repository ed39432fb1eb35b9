// NameTable and the run-time choice of the piece parser.
#include <functional>

#include "prof/parse_piece.h"

namespace molora::prof::detail {

namespace generic {
void parse_piece_impl(const char* data, size_t len, uint64_t base, PieceResult* out);
}
#if MOLORA_PROF_AVX2
namespace avx2 {
void parse_piece_impl(const char* data, size_t len, uint64_t base, PieceResult* out);
}
#endif

void parse_piece(const char* data, size_t len, uint64_t base, PieceResult* out) {
#if MOLORA_PROF_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                           __builtin_cpu_supports("pclmul");
  if (avx2) return avx2::parse_piece_impl(data, len, base, out);
#endif
  generic::parse_piece_impl(data, len, base, out);
}

void NameTable::grow() {
  size_t n = slots_.empty() ? 1024 : slots_.size() * 2;
  slots_.assign(n, -1);
  for (int32_t i = 0; i < static_cast<int32_t>(names.size()); ++i) {
    size_t h = std::hash<std::string_view>{}(names[i]) & (n - 1);
    while (slots_[h] >= 0) h = (h + 1) & (n - 1);
    slots_[h] = i;
  }
}

int32_t NameTable::intern(std::string_view s) {
  if ((names.size() + 1) * 2 > slots_.size()) grow();
  size_t mask = slots_.size() - 1;
  size_t h = std::hash<std::string_view>{}(s)&mask;
  while (slots_[h] >= 0) {
    if (names[slots_[h]] == s) return slots_[h];
    h = (h + 1) & mask;
  }
  int32_t id = static_cast<int32_t>(names.size());
  names.emplace_back(s);
  slots_[h] = id;
  return id;
}

}  // namespace molora::prof::detail
