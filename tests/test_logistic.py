"""The logistic classifier applies its coefficients by scikit-learn's own arithmetic: the same probabilities to
the last bit, and a saved one scores without importing scikit-learn."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from vflo.nn.estimators import LogisticEstimator, logistic_proba


@pytest.mark.parametrize("n_classes", [2, 3, 5])
@pytest.mark.parametrize("params", [{}, {"solver": "newton-cg"}])
def test_its_probabilities_are_scikit_learns_to_the_last_bit(n_classes: int, params: dict[str, str]) -> None:
    rng = np.random.default_rng(n_classes)
    X = rng.normal(size=(600, 7))
    y = (X[:, :n_classes].argmax(axis=1) + (rng.random(600) < 0.2)) % n_classes
    model = LogisticRegression(max_iter=5000, **params).fit(X, y)  # type: ignore[arg-type]
    new = rng.normal(size=(300, 7)) * 3
    assert np.array_equal(logistic_proba(new, model.coef_, model.intercept_), model.predict_proba(new))
    ours = LogisticEstimator(C=1.0, n_classes=n_classes, seed=0, params=params).fit(X, y)
    assert np.array_equal(ours.predict_scores(new), model.predict_proba(new))


def test_a_restored_one_scores_without_scikit_learn() -> None:
    X = np.random.default_rng(0).normal(size=(200, 4))
    fitted = LogisticEstimator(C=1.0, n_classes=2, seed=0).fit(X, (X[:, 0] > 0).astype(int))
    given = json.dumps({"state": {k: v.tolist() for k, v in fitted.get_state().items()}, "rows": X[:3].tolist()})
    code = ("import json, sys, numpy as np; from vflo.nn.estimators import LogisticEstimator; "
            "given = json.loads(sys.stdin.read()); "
            "e = LogisticEstimator(C=1.0, n_classes=2, seed=0).set_state("
            "{k: np.asarray(v) for k, v in given['state'].items()}); "
            "print(json.dumps([e.predict_scores(np.asarray(given['rows'])).tolist(), 'sklearn' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], input=given, capture_output=True, text=True, check=True)
    scores, imported = json.loads(done.stdout)
    assert np.array_equal(np.asarray(scores), fitted.predict_scores(X[:3])) and not imported
