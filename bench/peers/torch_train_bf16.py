"""The PyTorch training peer under CPU automatic mixed precision (bfloat16), for comparing
like with like when our step runs --mixed_precision=mixed_bfloat16. It runs in the peers'
environment (../shared/bench/peers/setup.sh), not in this project's.

    /tmp/peerenv/bin/python bench/peers/torch_train_bf16.py --batching bucketed --json

Runs ../shared/bench/peers/torch_train.py (or --peer_script) unchanged except that the model's
forward pass runs under `torch.autocast("cpu", dtype=torch.bfloat16)` and its logits are cast
back to float32 for the loss, PyTorch's documented recipe for bfloat16 training on CPU. Every
other argument goes to the peer script.
"""

import importlib.util
import os
import sys

_DEFAULT_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                             os.pardir, "shared", "bench", "peers", "torch_train.py")


def _load_peer(path):
  spec = importlib.util.spec_from_file_location("torch_train", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main():
  path = _DEFAULT_PEER
  if sys.argv[1:2] == ["--peer_script"]:
    path = sys.argv[2]
    del sys.argv[1:3]
  if "--repeats" in sys.argv:
    raise SystemExit("torch_train_bf16.py: one run per process (--repeats would start the peer "
                     "without autocast); repeat with bench.alternate")
  peer = _load_peer(os.path.normpath(path))
  build_model = peer.build_model

  def build_autocast_model(torch, args):
    model = build_model(torch, args)
    forward = model.forward

    def autocast_forward(*inputs, **kwargs):
      with torch.autocast("cpu", dtype=torch.bfloat16):
        return forward(*inputs, **kwargs).float()

    model.forward = autocast_forward
    return model

  peer.build_model = build_autocast_model
  peer.main()


if __name__ == "__main__":
  main()
