// Anchor object of libmolora.so; the parts are linked in whole.
#include "molora/version.h"
