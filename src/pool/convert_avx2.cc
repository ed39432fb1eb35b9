// The conversion loops of convert_kernels.h built for AVX2 (this file is compiled with -mavx2 on
// x86-64 only; convert.cc calls it when the CPU has AVX2). No FMA: results equal the baseline
// build and the scalar references bit for bit.
#include "pool/convert_kernels.h"

namespace molora::pool {

ConvertRowsFn convert_rows_avx2(int s, int d) { return convert_rows_table(s, d); }

}  // namespace molora::pool
