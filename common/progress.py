"""Progress of long work (download, corpus scan, SentencePiece, training, decoding) on stdout.

On a terminal a bar is one line redrawn in place; anywhere else (a log file, nohup, Slurm) it
prints a plain line now and then and at the end, never a control code. The rate and the ETA
count only the work done since the bar started, so a resumed run's ETA is right at once.
"""

import sys
import time

_REDRAW_S = 0.2  # least time between two redraws of a terminal line


def _clock(seconds: float) -> str:
  """H:MM:SS or M:SS."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _value(value) -> str:
  if isinstance(value, float):
    return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.4g}"
  return str(value)


class ProgressBar:
  """A count of `total` units of work (None: unknown), with named values shown beside it.

  Args:
    total: the count at which the work is done, or None.
    unit: what is counted, singular ("step", "sentence", "line").
    label: what the work is, shown first ("decoding dev").
    initial: the count already done when the bar starts (a resumed run's step): it is shown
      but not counted in the rate.
    stream: where the bar goes (default sys.stdout); a terminal gets the redrawn line.
    log_every_s: off a terminal, the least time between two plain lines.
    delay_s: show nothing until the work has taken this long (quick work stays silent).
    time_limit_s: the work stops after this many seconds from the bar's start at the latest
      (a time budget, as train_minutes): the ETA is never later, and the bar counts toward
      whichever comes first.
  """

  def __init__(self, total: int | None, unit: str = "step", label: str = "", initial: int = 0,
               stream=None, log_every_s: float = 30.0, delay_s: float = 0.0,
               time_limit_s: float | None = None):
    self.total, self.unit, self.label = total, unit, label
    self.initial = self.current = initial
    self.stream = stream or sys.stdout
    self.is_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
    self.log_every_s = log_every_s
    self.delay_s = delay_s
    self.time_limit_s = time_limit_s
    self.values = {}
    self.start = time.monotonic()
    self._last_shown = -float("inf")
    self._shown = None
    self._open_line = False

  def update(self, current: int, values: dict | None = None, force: bool = False):
    """Sets the count to `current` and the shown values to `values` (merged with earlier)."""
    self.current = current
    self.values.update(values or {})
    now = time.monotonic()
    done = self.total is not None and current >= self.total
    wait = _REDRAW_S if self.is_terminal else self.log_every_s
    if now - self.start < self.delay_s and not force:
      return
    if force or done or now - self._last_shown >= wait:
      self._show(now)

  def add(self, count: int = 1, values: dict | None = None):
    self.update(self.current + count, values)

  def close(self):
    """Shows the final state (unless already shown) and ends the terminal line."""
    if self._shown is None and time.monotonic() - self.start < self.delay_s:
      return
    if self._shown != (self.current, tuple(self.values.items())):
      self._show(time.monotonic())
    if self._open_line:
      self.stream.write("\n")
      self.stream.flush()
      self._open_line = False

  def line(self, now: float | None = None) -> str:
    """The bar's text: count, percentage, rate, elapsed time, ETA and values."""
    elapsed = (now if now is not None else time.monotonic()) - self.start
    rate = (self.current - self.initial) / elapsed if elapsed > 0 else 0.0
    parts = [f"{self.current}/{self.total} {self.unit}s" if self.total is not None
             else f"{self.current} {self.unit}s"]
    if self.label:
      parts[0] = f"{self.label}: {parts[0]}"
    if self.total:
      parts[0] += f" ({100.0 * self.current / self.total:.0f}%)"
    if rate >= 100:
      parts.append(f"{rate:,.0f} {self.unit}s/s")
    elif rate >= 1 or rate == 0:
      parts.append(f"{rate:.3g} {self.unit}s/s")
    else:
      parts.append(f"{1 / rate:.3g} s/{self.unit}")
    parts.append(f"elapsed {_clock(elapsed)}")
    left = []
    if self.total is not None and rate > 0 and self.current < self.total:
      left.append((self.total - self.current) / rate)
    if self.time_limit_s is not None:
      left.append(max(self.time_limit_s - elapsed, 0.0))
    if left:
      parts.append(f"ETA {_clock(min(left))}")
    parts += [f"{name} {_value(value)}" for name, value in self.values.items()]
    return ", ".join(parts)

  def _show(self, now: float):
    self._last_shown = now
    self._shown = (self.current, tuple(self.values.items()))
    text = self.line(now)
    if self.is_terminal:
      self.stream.write(f"\r{text}\033[K")  # \033[K: erase what a longer previous line left
      self._open_line = True
    else:
      self.stream.write(text + "\n")
    self.stream.flush()
