#include "common/matrix.h"

namespace moeserve {

void Matrix::row_f32(int64_t r, float* out) const {
  size_t element = dtype_size(dtype);
  convert_to_f32(dtype, static_cast<const uint8_t*>(data) + size_t(r) * size_t(cols) * element, out, size_t(cols));
  if (scale_inv) {
    const float* scales = scale_inv + (r / block_rows) * scale_cols();
    for (int64_t c = 0; c < cols; ++c) out[c] *= scales[c / block_cols];
  }
}

}  // namespace moeserve
