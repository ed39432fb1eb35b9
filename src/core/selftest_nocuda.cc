// device_selftest for builds without CUDA.
#include "molora/info.h"

namespace molora {
Status device_selftest(int) { return Status::Unavailable("molora was built without CUDA"); }
}  // namespace molora
