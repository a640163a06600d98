"""The TensorFlow runtime of a training run: seeds, determinism, devices and the strategy."""

import dataclasses

import keras
import tensorflow as tf
from absl import logging


def set_up_runtime(train_config) -> tf.distribute.Strategy:
  """Seeds, determinism, devices and the strategy: call it before any other TensorFlow work.

  It must come first because logical CPU devices and collective (multi-worker) runtimes
  cannot be configured once TensorFlow has started, and because seeding clears TensorFlow's
  kernel cache, which destroys the resources that eager kernels own.
  """
  c = train_config
  keras.utils.set_random_seed(c.seed)
  if c.deterministic:
    tf.config.experimental.enable_op_determinism()
  strategy = _make_strategy(c.distribution, c.num_cpu_devices, c.tpu)
  name = "none (one device)" if c.distribution == "default" else type(strategy).__name__
  logging.info("devices: %s; strategy: %s with %d replica(s)",
               ", ".join(f"{d.name} ({d.device_type})" for d in tf.config.list_logical_devices()),
               name, strategy.num_replicas_in_sync)
  return strategy


def _make_strategy(distribution: str, num_cpu_devices: int, tpu: str) -> tf.distribute.Strategy:
  """One device (default), MirroredStrategy over GPUs or logical CPUs, MultiWorkerMirrored
  across the hosts of TF_CONFIG, or TPUStrategy."""
  if num_cpu_devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
  if distribution == "mirrored":
    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    devices = devices or [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)
  if distribution == "multi_worker":
    return tf.distribute.MultiWorkerMirroredStrategy()
  if distribution == "tpu":
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  return tf.distribute.get_strategy()


def worker_info(strategy) -> tuple[int, int, bool]:
  """(number of workers, this worker's index, whether it is the chief) of a strategy.

  The chief (task "chief", or worker 0 when the cluster has none) writes checkpoints and
  summaries; the other workers write theirs to throwaway folders.
  """
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.cluster_spec().as_dict():
    return 1, 0, True
  cluster = resolver.cluster_spec().as_dict()
  task_type, task_id = resolver.task_type, resolver.task_id or 0
  workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
  index = task_id + (1 if task_type == "worker" and "chief" in cluster else 0)
  is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0
                                      and "chief" not in cluster)
  return workers, index, is_chief


# CPU flags of native bfloat16 dot products (AVX512-BF16: Cooper Lake, Sapphire Rapids and
# later Xeons, AMD Zen 4 and later; AMX-BF16: Sapphire Rapids and later)
_BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
  """The feature flags of the first CPU in `cpuinfo` (empty where there is no such file)."""
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def native_bfloat16(strategy) -> bool:
  """Whether every device of `strategy` multiplies bfloat16 matrices in hardware: TPUs, GPUs of
  compute capability 8.0 (Ampere) or later, CPUs with AVX512-BF16 or AMX-BF16."""
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return True
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:  # the strategies train on the GPUs whenever there are any
    return all(tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0))
               >= (8, 0) for gpu in gpus)
  return bool(cpu_flags() & set(_BFLOAT16_CPU_FLAGS))


def resolve_precision(train_config, strategy):
  """`train_config` with mixed_precision="auto" replaced by the policy this machine runs
  fastest at equal quality: mixed_bfloat16 where `native_bfloat16`, float32 elsewhere (16-bit
  compute without the hardware costs casts and gains nothing). Other values pass unchanged."""
  precision = train_config.mixed_precision
  if precision == "auto":
    precision = "mixed_bfloat16" if native_bfloat16(strategy) else "float32"
    logging.info("precision: %s (mixed_precision=auto: %s)", precision,
                 "bfloat16 matmuls in hardware" if precision != "float32" else
                 "no bfloat16 matmul units found")
  return dataclasses.replace(train_config, mixed_precision=precision)
