"""The ``digits`` dataset: scikit-learn's 8x8 handwritten digits, split and normalised.

Why this set: it checks accuracy, not just throughput, and it works offline (1,797 images of
10 classes ship inside scikit-learn). The train/test split is stratified 80/20 and fixed,
independent of the job's seed, so test accuracy is comparable across runs. Shaping the
images for a model (flat, 8x8 or upsampled) is :mod:`workers.data`'s job.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

DIGITS_CLASSES = 10
DIGITS_TOTAL = 1797
DIGITS_TEST_FRACTION = 0.2
#: The split never depends on the job's seed, so test accuracy is comparable across runs.
DIGITS_SPLIT_SEED = 0


@lru_cache(maxsize=1)
def digits_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Indices into ``load_digits()`` of the train and test splits: stratified, fixed 80/20."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    labels = load_digits().target
    train, test = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=labels
    )
    return train, test


@lru_cache(maxsize=1)
def digits_splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Both splits as (features in [0, 1] standardised with train statistics, labels).

    One scalar mean/std (not per pixel: border pixels are always 0 and have no spread).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    train, test = digits_split_indices()
    mean, std = x[train].mean(), x[train].std()
    return {"train": ((x[train] - mean) / std, y[train]), "test": ((x[test] - mean) / std, y[test])}
