// parse_piece.cc compiled for AVX2 (simdjson's haswell kernel); see src/prof/CMakeLists.txt.
#define MOLORA_PROF_PARSE_NS avx2
#include "parse_piece.cc"  // NOLINT(bugprone-suspicious-include)
