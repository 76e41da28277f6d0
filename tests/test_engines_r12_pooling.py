"""Mean pooling leaves padding out of the sum rather than multiplying it by zero: a NaN or an
infinity that an fp16 engine computed at a padding position (0 x inf is NaN) made the whole
row's vector NaN, so a text failed beside a longer one and passed alone. Both poolings, the
host's (ONNX Runtime, TensorRT) and the torch engine's on its device."""

from __future__ import annotations

import numpy as np
import torch

from workers.engines.text_encoding import mean_pool_normalize
from workers.engines.torch_encoder import mean_pool

# Two rows of three positions, two features: row 0 has one real token and two of padding (one of
# them overflowed), row 1 none at all (a row padding a CUDA graph's batch bucket).
HIDDEN = np.array(
    [[[3.0, 4.0], [np.inf, 1.0], [np.nan, 2.0]], [[np.inf, 5.0], [1.0, 1.0], [2.0, 2.0]]],
    dtype=np.float32,
)
MASK = np.array([[1, 0, 0], [0, 0, 0]], dtype=np.int64)
EXPECTED = np.array([[0.6, 0.8], [0.0, 0.0]], dtype=np.float32)  # row 0 alone, normalised


def test_padding_that_overflowed_never_reaches_a_hosts_vector() -> None:
    np.testing.assert_allclose(mean_pool_normalize(HIDDEN, MASK), EXPECTED, atol=1e-6)


def test_padding_that_overflowed_never_reaches_a_devices_vector() -> None:
    pooled = mean_pool(torch.from_numpy(HIDDEN), torch.from_numpy(MASK))
    np.testing.assert_allclose(pooled.numpy(), [[3.0, 4.0], [0.0, 0.0]], atol=1e-6)
