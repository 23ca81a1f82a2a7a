"""Label inference by a passive party from what split learning sends it.

Threat model: an honest-but-curious passive party (it runs the protocol as written) that wants the active
party's labels of the rows it shares.

* :func:`norm_scores`, :func:`direction_scores`: Li et al., "Label Leakage and Protection in Two-party Split
  Learning" (ICLR 2022). The gradient of the loss with respect to a row's activations has a larger norm for
  the rarer class (norm scoring), and gradients of rows of one class point alike (direction scoring: cosine
  with the gradient of one row whose label the passive party knows).
* :func:`instance_space_scores`: against SecureBoost (Cheng et al. 2021, whose reduced-leakage variant grows the
  first tree at the active party alone for this reason): the people a partner is asked to sum a node over share
  a region of the active party's gradients, so with a few known labels, the share of positives among the known
  people of a person's node scores that person.
* :func:`model_completion`: Fu et al., "Label Inference Attacks Against Vertical Federated Learning"
  (USENIX Security 2022), passive model completion: with a few rows' labels (k), the passive party trains a
  small head on its own trained bottom network's outputs and labels every other row.

Each returns the area under the ROC curve of separating the two classes (binary tasks; for the better of the
score's two orientations, and with label 1 ranked first beside it) or accuracy (:func:`model_completion`),
measured against the true labels the experiment knows.
"""

from __future__ import annotations

import numpy as np

from vflo.errors import ConfigError


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels)
    if len(np.unique(labels)) != 2:
        raise ConfigError("label inference AUC needs a binary task with both classes among the rows")
    return float(roc_auc_score(labels, scores))


def norm_scores(gradients: np.ndarray) -> np.ndarray:
    """Each gradient row's L2 norm: the score of being the (rarer) positive class."""
    norms: np.ndarray = np.linalg.norm(np.asarray(gradients, dtype=np.float64), axis=1)
    return norms


def direction_scores(gradients: np.ndarray, known_positive: int) -> np.ndarray:
    """Cosine of each gradient row with that of row ``known_positive``, whose label (positive) the attacker
    knows."""
    G = np.asarray(gradients, dtype=np.float64)
    ref = G[known_positive]
    norms = np.linalg.norm(G, axis=1) * max(float(np.linalg.norm(ref)), 1e-12)
    scores: np.ndarray = G @ ref / np.maximum(norms, 1e-12)
    return scores


def either_way(auc: float) -> float:
    """The AUC of the better orientation of a score, max(AUC, 1 - AUC): a score that ranks the negatives first
    separates the classes as well as one that ranks the positives first (0.5: no separation at all). Which
    orientation holds is one bit, which a single known label, or the class balance, tells the attacker."""
    return max(auc, 1.0 - auc)


def gradient_attacks(ids: np.ndarray, gradients: np.ndarray, labels_of: dict[object, int], *,
                     rng: np.random.Generator) -> dict[str, float]:
    """AUC of norm and direction scoring over every gradient row the passive party received: ``norm_auc`` and
    ``direction_auc`` for the better orientation (:func:`either_way`), ``*_auc_positive`` with label 1 ranked
    first."""
    y = np.asarray([labels_of[i] for i in ids.tolist()])
    positives = np.flatnonzero(y == 1)
    if len(positives) == 0:
        raise ConfigError("no positive row among the gradients")
    known = int(rng.choice(positives))
    norm = _auc(norm_scores(gradients), y)
    direction = _auc(direction_scores(gradients, known), y)
    return {"norm_auc": either_way(norm), "direction_auc": either_way(direction),
            "norm_auc_positive": norm, "direction_auc_positive": direction}


def model_completion(outputs: np.ndarray, labels: np.ndarray, *, known: int, rng: np.random.Generator) -> float:
    """Accuracy on the other rows of a head trained on ``known`` labelled rows of the passive party's own
    bottom-model ``outputs`` (one row per person it shares with the active party)."""
    from sklearn.linear_model import LogisticRegression

    labels = np.asarray(labels)
    if known >= len(labels):
        raise ConfigError(f"model completion with {known} known labels needs more than {known} rows")
    order = rng.permutation(len(labels))
    seen, rest = order[:known], order[known:]
    if len(np.unique(labels[seen])) < 2:
        return float(np.mean(labels[rest] == labels[seen][0]))  # one class known: it can only guess that one
    head = LogisticRegression(max_iter=2000, C=1.0).fit(outputs[seen], labels[seen])
    return float(np.mean(head.predict(outputs[rest]) == labels[rest]))


def instance_space_scores(groups: np.ndarray, labels: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Each person's score from the nodes they shared (``groups``: people x trees, a node number per tree, -1 for
    none): per tree, the share of positives among the ``known`` people of their node (smoothed towards the known
    people's share), averaged over the trees that placed them."""
    groups = np.asarray(groups, dtype=np.int64).reshape(len(labels), -1)
    prior = float(np.mean(labels[known])) if known.any() else 0.5
    total, placed = np.zeros(len(labels)), np.zeros(len(labels))
    for t in range(groups.shape[1]):
        nodes = groups[:, t]
        seen = nodes >= 0
        if not seen.any():
            continue
        index = np.unique(nodes[seen], return_inverse=True)[1]
        size = int(index.max()) + 1
        hits = np.bincount(index[known[seen]], weights=labels[seen][known[seen]], minlength=size)
        count = np.bincount(index[known[seen]], minlength=size)
        total[seen] += ((hits + prior) / (count + 1))[index]
        placed[seen] += 1
    out: np.ndarray = np.where(placed > 0, total / np.maximum(placed, 1), prior)
    return out


def instance_space_attack(groups: np.ndarray, labels: np.ndarray, *, known: int, rng: np.random.Generator,
                          draws: int = 5) -> float:
    """ROC AUC, over the people whose labels it does not know, of :func:`instance_space_scores` with ``known``
    people's labels known, averaged over ``draws`` random draws of whom it knows (a few known labels may all be
    of one class, which tells it nothing: AUC 0.5 for that draw)."""
    labels = np.asarray(labels, dtype=np.float64)
    if known >= len(labels):
        raise ConfigError(f"the instance-space attack with {known} known labels needs more than {known} people")
    aucs = []
    for _ in range(draws):
        mask = np.zeros(len(labels), dtype=bool)
        mask[rng.permutation(len(labels))[:known]] = True
        aucs.append(_auc(instance_space_scores(groups, labels, mask)[~mask], labels[~mask]))
    return float(np.mean(aucs))
