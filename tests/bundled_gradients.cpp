#include "bundled_gradients.hpp"

#ifndef SIDCO_GRADIENTS_DIR
#error "SIDCO_GRADIENTS_DIR is set by meson.build"
#endif

const char* sidco::bundled::gradients_dir() { return SIDCO_GRADIENTS_DIR; }
