"""Item vectors: a unit vector of `settings.dimension` floats per item, the same in every process.

- An item with an embedding (`Item.vector`) uses it. An embedding of exactly `dimension` floats is
  only scaled to unit length; one of any other length is *projected* by the hashing trick: input
  component `k` is added, with a sign, to output component `hash(k) mod dimension` (hash and sign
  from the stable hash below). Such a signed random projection keeps dot products in expectation,
  so similarities between projected embeddings stay meaningful, and a provider's 1536-float
  embedding needs no configuration to fit a 64-float recommender.
- Otherwise the vector comes from the item's text by *feature hashing*: the tokens of its name
  (weight 2) and description (weight 1) and its categories (weight 3, as `cat:<name>` features)
  each add ±weight to one component. Items sharing words or categories point the same way.
  An item with no text at all hashes its id, so every item has a direction of its own.

The hash is BLAKE2b (8 bytes) of the feature's UTF-8, never Python's `hash()`, which is salted per
process and would give every replica different vectors. Items whose vectors come from different
sources (an embedding model, feature hashing) live in unrelated spaces: their similarities are
noise until the embedding refresh has given every item an embedding.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from tidegate.errors import InvalidRecsInput
from tidegate.recs.model import Item

__all__ = ["Vector", "item_vector", "project", "stable_hash", "text_vector", "tokens"]

Vector = npt.NDArray[np.float64]

NAME_WEIGHT = 2.0
DESCRIPTION_WEIGHT = 1.0
CATEGORY_WEIGHT = 3.0
_TOKEN = re.compile(r"\w+")
_SIGN_BIT = 1 << 63


def stable_hash(feature: str) -> int:
    """A 64-bit hash of `feature` that every process and every run agrees on."""
    return int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")


def tokens(text: str) -> list[str]:
    """The lower-cased word tokens of `text` (Unicode letters and digits)."""
    return _TOKEN.findall(text.casefold())


def _hashed(features: Iterable[tuple[str, float]], dimension: int) -> Vector:
    vector = np.zeros(dimension, dtype=np.float64)
    for feature, weight in features:
        code = stable_hash(feature)
        vector[code % dimension] += -weight if code & _SIGN_BIT else weight
    return vector


def _unit(vector: Vector) -> Vector | None:
    norm = float(np.linalg.norm(vector))
    return None if norm == 0.0 or not math.isfinite(norm) else vector / norm


def text_vector(item: Item, dimension: int) -> Vector:
    """The feature-hashed unit vector of the item's name, description and categories (its id when
    it has none of them)."""
    features: list[tuple[str, float]] = [(token, NAME_WEIGHT) for token in tokens(item.name)]
    features += [(token, DESCRIPTION_WEIGHT) for token in tokens(item.description)]
    features += [(f"cat:{category.casefold()}", CATEGORY_WEIGHT) for category in item.categories]
    unit = _unit(_hashed(features, dimension))
    if unit is None:  # no text, or every feature cancelled out
        unit = _unit(_hashed([(f"id:{item.item_id}", 1.0)], dimension))
    assert unit is not None  # one feature never cancels out
    return unit


def project(values: Sequence[float], dimension: int) -> Vector | None:
    """`values` as a unit vector of `dimension` floats (scaled only when the length already fits,
    else hashed; see the module docstring); None for a zero vector."""
    raw = np.asarray(values, dtype=np.float64)
    if raw.shape[0] == dimension:
        return _unit(raw.copy())
    return _unit(_hashed(((f"dim:{k}", float(x)) for k, x in enumerate(raw) if x != 0.0), dimension))


def item_vector(item: Item, dimension: int) -> Vector:
    """The item's unit vector: its embedding projected to `dimension` when it has a non-zero one,
    else the hash of its text. Raises InvalidRecsInput for an embedding with non-finite values."""
    if item.vector is not None and len(item.vector) > 0:
        raw = np.asarray(item.vector, dtype=np.float64)
        if raw.ndim != 1 or not np.all(np.isfinite(raw)):
            raise InvalidRecsInput(
                f"item {item.item_id!r}: vector must be a flat sequence of finite numbers"
            )
        unit = project(raw.tolist(), dimension)
        if unit is not None:
            return unit
    return text_vector(item, dimension)
