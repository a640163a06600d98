"""`python -m tf_transformer.train --flagfile=...`: the training tool (tf_transformer/bin/train.py)
under the name this project is known by."""

from tf_transformer.bin import train

if __name__ == "__main__":
  train.run()
