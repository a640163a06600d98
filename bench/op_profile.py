"""Where the time goes: trace a block with the TensorFlow profiler and sum time by op type.

    with op_profile.traced(logdir):
      ...                       # the steps to profile
    print(op_profile.table(logdir))

The trace is also viewable in TensorBoard's Profile tab (`tensorboard --logdir <logdir>`, with
the tensorboard-plugin-profile package). Op times are summed over the TensorFlow executor
threads (Eigen's thread-pool work is counted inside the op that started it), so shares are of
op time, not of wall time.
"""

import collections
import contextlib
import glob
import os


@contextlib.contextmanager
def traced(logdir: str):
  import tensorflow as tf
  tf.profiler.experimental.start(logdir)
  try:
    yield
  finally:
    tf.profiler.experimental.stop()


def op_times(logdir: str) -> collections.Counter:
  """Milliseconds per TensorFlow op type in the newest trace under `logdir`."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  path = max(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
             key=os.path.getmtime)
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  times = collections.Counter()
  for plane in space.planes:
    names = {key: meta.name for key, meta in plane.event_metadata.items()}
    for line in plane.lines:
      if not line.name.startswith("tf_Compute"):  # the executor threads running ops
        continue
      for event in line.events:
        name = names.get(event.metadata_id, "")
        # ops are "node:OpType"; "ExecutorState::..." and others are the executor's own spans
        if ":" in name and "::" not in name:
          times[name.split(":")[-1]] += event.duration_ps / 1e9
  return times


def table(logdir: str, top: int = 15) -> str:
  """The `top` op types by time, with their share of all op time."""
  times = op_times(logdir)
  total = sum(times.values()) or 1.0
  rows = [f"{'op':24s} {'ms':>9s} {'share':>6s}"]
  rows += [f"{op:24s} {ms:9.1f} {100 * ms / total:5.1f}%" for op, ms in times.most_common(top)]
  return "\n".join(rows)
