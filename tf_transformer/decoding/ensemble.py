"""Several models as one in decoding: at each step of one search their log-probabilities are
averaged (weighted), as in Marian's ensemble decoding.

The mean of log-softmax (a product of experts), not the log of the mean probability: a token
must be likely under every member, the ensemble's `score` of a translation is the weighted mean
of the members' forced-decoding scores, and the combination is not renormalised (Marian's
choice; fairseq averages probabilities instead). Members share the vocabulary; their sizes may
differ.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """Transformers decoded together.

  Attributes:
    members: the models (at least two).
    weights: one per member, > 0, normalised to sum to 1 (default: equal).
  """
  members: tuple
  weights: tuple = ()

  def __post_init__(self):
    members = tuple(self.members)
    if len(members) < 2:
      raise ValueError(f"an ensemble needs at least two models, got {len(members)}")
    weights = tuple(float(w) for w in self.weights) or (1.0,) * len(members)
    if len(weights) != len(members) or min(weights) <= 0:
      raise ValueError(f"an ensemble of {len(members)} models needs as many weights > 0, got "
                       f"{list(weights)}")
    sizes = {member.target_vocab_size for member in members}
    if len(sizes) > 1:
      raise ValueError(f"an ensemble's members must share the target vocabulary, got sizes "
                       f"{sorted(sizes)}")
    total = sum(weights)
    object.__setattr__(self, "members", members)
    object.__setattr__(self, "weights", tuple(weight / total for weight in weights))

  @property
  def target_vocab_size(self) -> int:
    return self.members[0].target_vocab_size

  @property
  def variables(self) -> list:
    return [variable for member in self.members for variable in member.variables]


def weighted_members(model) -> tuple:
  """((member, weight), ...) of an Ensemble, or ((model, 1.0),) of a single model."""
  if isinstance(model, Ensemble):
    return tuple(zip(model.members, model.weights))
  return ((model, 1.0),)
