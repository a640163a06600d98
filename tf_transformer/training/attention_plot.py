"""Attention heat maps as PNG images (for TensorBoard's Images tab)."""

import io
import logging as std_logging
import warnings

import numpy as np

# fonts tried in order for each piece: Latin, then CJK scripts (Japanese sources), if installed
_FONTS = ["DejaVu Sans", "Noto Sans CJK JP", "Noto Sans CJK SC", "Droid Sans Fallback"]


def heat_map_png(source_tokens: list[str], target_tokens: list[str], weights,
                 title: str = "") -> bytes:
  """A PNG of `weights`: one row per target piece, one column per source piece.

  Args:
    source_tokens: the S subword pieces read (the x tick labels).
    target_tokens: the T subword pieces written (the y tick labels).
    weights: float [T, S], e.g. one sentence's cross-attention from the `align` signature.
    title: shown above the map.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top  (only evaluation draws)
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  weights = np.asarray(weights, dtype=np.float32)
  rows, columns = weights.shape
  width, height = 1.5 + 0.32 * columns, 1.2 + 0.28 * rows
  figure, axes = pyplot.subplots(figsize=(max(width, 4.0), max(height, 3.0)), dpi=100)
  try:
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6),
                        aspect="auto", interpolation="nearest")
    with warnings.catch_warnings():  # a piece in a script no installed font covers
      warnings.simplefilter("ignore")
      std_logging.getLogger("matplotlib.font_manager").setLevel(std_logging.ERROR)
      axes.set_xticks(range(columns), source_tokens, rotation=90, fontsize=8, family=_FONTS)
      axes.set_yticks(range(rows), target_tokens, fontsize=8, family=_FONTS)
      axes.set_xlabel("source")
      axes.set_ylabel("target")
      if title:
        axes.set_title(title, fontsize=9, family=_FONTS)
      figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
      figure.tight_layout()
      buffer = io.BytesIO()
      figure.savefig(buffer, format="png")
  finally:
    pyplot.close(figure)
  return buffer.getvalue()


def real_tokens(source_tokens, target_tokens, attention):
  """One sentence of the `align` signature without its padding.

  Args:
    source_tokens: bytes or str [S] ("" as padding); target_tokens: [T]; attention: [T, S].

  Returns:
    (source pieces, target pieces, float32 [T', S'] weights) of the real pieces.
  """
  decode = lambda t: t.decode("utf-8") if isinstance(t, bytes) else str(t)
  source = [decode(t) for t in source_tokens if decode(t)]
  target = [decode(t) for t in target_tokens if decode(t)]
  return source, target, np.asarray(attention)[:len(target), :len(source)]
