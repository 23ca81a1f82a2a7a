"""Estimators on a plain feature matrix (a party's own features, or pooled ones in simulation).

All share one shape, as in scikit-learn: ``fit(X, y)`` returns ``self`` and sets
learned state with a trailing underscore; ``predict_scores(X)`` returns class
probabilities ``(n, C)`` over *all* C classes (even ones missing from training) or
regression values ``(n,)`` (``(n, k)`` for an MLP or ridge fitted on k targets).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from vflo.blocks import CHUNK
from vflo.data.datasets import Task
from vflo.errors import ConfigError
from vflo.executor import in_blocks
from vflo.nn.train import History, TrainConfig, as_tensor, fit_module, load_module_state, module_state
from vflo.seeding import numpy_rng, torch_generator
from vflo.spill import DiskRows, Rows

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn import functional as F
else:
    from vflo.lazy import functional as F
    from vflo.lazy import torch


BUILTIN_MODELS = ("auto", "logistic", "linear", "mlp", "best")


def sklearn_estimators() -> dict[str, type]:
    """scikit-learn's classifiers and regressors by class name."""
    from sklearn.utils import all_estimators

    return {name: cls for name, cls in all_estimators(type_filter=["classifier", "regressor"])}


@dataclass(frozen=True, kw_only=True)
class EstimatorConfig:
    """A model on one feature matrix.

    ``model``: ``'auto'`` (the default: logistic regression for classification, ridge regression for
    regression), ``'logistic'`` (logistic regression), ``'linear'`` (ridge regression),
    ``'mlp'`` (a PyTorch MLP: ``hidden``, ``activation``, ``train``), ``'best'`` (the linear model and that MLP,
    each fitted on all but a validation share of the rows, the better on it refitted on all), or the class name of any
    scikit-learn classifier or regressor (e.g. ``'RandomForestClassifier'``) with its keyword
    arguments in ``params``.
    """

    model: str = "auto"
    C: float = 1.0
    hidden: tuple[int, ...] = (64, 32)
    activation: str = "relu"
    train: TrainConfig = field(default_factory=TrainConfig)
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.C > 0:
            raise ConfigError(f"C must be positive, got {self.C}")
        if self.model not in BUILTIN_MODELS:
            known = sklearn_estimators()
            if self.model not in known:
                from vflo.errors import did_you_mean

                raise ConfigError(
                    f"model {self.model!r} is neither {', '.join(BUILTIN_MODELS)} nor a scikit-learn estimator"
                    f"{did_you_mean(self.model, [*BUILTIN_MODELS, *known])}; use a class name such as "
                    "'RandomForestClassifier'"
                )
        elif self.params and self.model == "mlp":
            raise ConfigError("params is for scikit-learn models; the MLP takes hidden, activation and train")


class Estimator(Protocol):
    def fit(self, X: Rows, y: np.ndarray) -> Estimator: ...

    def predict_scores(self, X: Rows) -> np.ndarray: ...

    def get_state(self) -> dict[str, Any]:
        """What it learned, as arrays and plain values (no code): enough to score again after a restart."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> Estimator:
        """The fitted estimator back from :meth:`get_state` (on an estimator built from the same config)."""
        ...


def _array(state: Mapping[str, Any], key: str) -> np.ndarray:
    value = state.get(key)
    if not isinstance(value, np.ndarray):
        raise ConfigError(f"a saved estimator lacks {key!r}; the artifact is incomplete or from another model")
    return value


def training_stats(estimator: Estimator, prefix: str = "") -> dict[str, float]:
    """Epochs run and whether the stopping rule fired, for estimators trained by epochs (the MLP); else none."""
    history = getattr(estimator, "history_", None)
    return history.summary(prefix) if isinstance(history, History) else {}


def make_estimator(config: EstimatorConfig, *, task: Task, n_classes: int | None, seed: int) -> Estimator:
    if config.model == "auto":
        # The linear model that fits the task, so a method's defaults run on regression as on classification.
        config = replace(config, model="linear" if task == "regression" else "logistic")
    if config.model not in BUILTIN_MODELS:
        return SklearnEstimator(config.model, dict(config.params), task=task, n_classes=n_classes, seed=seed)
    if config.model == "best":
        return BestEstimator(config, task=task, n_classes=n_classes, seed=seed)
    if config.model == "logistic":
        if task == "regression":
            raise ConfigError("model = 'logistic' is for classification; use 'linear' or 'mlp' for regression")
        return LogisticEstimator(C=config.C, n_classes=_classes(task, n_classes), seed=seed, params=config.params)
    if config.model == "linear":
        if task != "regression":
            raise ConfigError("model = 'linear' is for regression; use 'logistic' or 'mlp' for classification")
        return LinearEstimator(alpha=1.0 / config.C)
    return MLPEstimator(
        task=task, n_classes=n_classes, hidden=config.hidden, activation=config.activation,
        train=config.train, seed=seed,
    )


class BestEstimator:
    """The better of the linear model and the MLP for these rows: each is fitted on all but a validation share
    (the MLP's ``train.validation_fraction``, at least 0.1), scored there (log-loss or squared error), and the
    better one is fitted again on every row. An oracle built on it bounds the linear and the MLP methods both."""

    def __init__(self, config: EstimatorConfig, *, task: Task, n_classes: int | None, seed: int) -> None:
        self.config, self.task, self.n_classes, self.seed = config, task, n_classes, seed
        self.choice_ = ""
        self.model_: Estimator | None = None

    def _make(self, kind: str) -> Estimator:
        return make_estimator(replace(self.config, model=kind), task=self.task, n_classes=self.n_classes,
                              seed=self.seed)

    def fit(self, X: Rows, y: np.ndarray) -> BestEstimator:
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(len(X))
        n_val = max(1, round(max(self.config.train.validation_fraction, 0.1) * len(X)))
        val, fit = order[:n_val], order[n_val:]
        linear = "linear" if self.task == "regression" else "logistic"
        losses = {}
        for kind in (linear, "mlp"):
            scores = self._make(kind).fit(X[fit], y[fit]).predict_scores(X[val])
            if self.task == "regression":
                losses[kind] = float(np.mean((np.asarray(scores).reshape(-1) - y[val]) ** 2))
            else:
                picked = np.clip(np.asarray(scores)[np.arange(len(val)), y[val].astype(np.int64)], 1e-12, 1.0)
                losses[kind] = float(-np.mean(np.log(picked)))
        self.choice_ = min(losses, key=lambda k: losses[k])
        self.losses_ = losses
        self.model_ = self._make(self.choice_).fit(X, y)
        self.history_ = getattr(self.model_, "history_", None)
        return self

    def predict_scores(self, X: Rows) -> np.ndarray:
        if self.model_ is None:
            raise ConfigError("the best-of estimator was not fitted")
        return self.model_.predict_scores(X)

    def get_state(self) -> dict[str, Any]:
        assert self.model_ is not None
        return {"best.choice": self.choice_, **{f"best.{k}": v for k, v in self.model_.get_state().items()}}

    def set_state(self, state: Mapping[str, Any]) -> BestEstimator:
        self.choice_ = str(state["best.choice"])
        inner = {k[len("best."):]: v for k, v in state.items() if k.startswith("best.") and k != "best.choice"}
        self.model_ = self._make(self.choice_).set_state(inner)
        return self


def by_chunks(score: Callable[[np.ndarray], np.ndarray], X: Rows) -> np.ndarray:
    """``score`` of ``X``'s rows: at once in memory, or :data:`CHUNK` rows at a time from a matrix on disk."""
    if not isinstance(X, DiskRows):
        return score(np.asarray(X))
    return np.concatenate([score(X[start:start + CHUNK]) for start in range(0, len(X), CHUNK)])


def _classes(task: Task, n_classes: int | None) -> int:
    if n_classes is None or n_classes < 2:
        raise ConfigError(f"a {task} task needs at least 2 classes")
    return n_classes


def full_proba(proba: np.ndarray, seen: np.ndarray, n_classes: int) -> np.ndarray:
    """Spread probabilities over seen classes into a matrix over all ``n_classes``."""
    out = np.zeros((proba.shape[0], n_classes), dtype=np.float64)
    out[:, seen.astype(np.int64)] = proba
    return out


def logistic_proba(X: np.ndarray, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """Class probabilities of a fitted logistic regression, by scikit-learn's own arithmetic (its
    ``predict_proba`` for lbfgs: the logistic function for two classes, softmax for more), so a saved model
    scores without importing scikit-learn and gives the same numbers to the last bit."""
    from scipy.special import expit

    scores: np.ndarray = np.asarray(X @ coef.T + intercept)
    if scores.shape[1] == 1:
        positive: np.ndarray = expit(scores.reshape(-1))
        return np.stack([1 - positive, positive], axis=1)
    scores -= scores.max(axis=1).reshape((-1, 1))
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=1).reshape((-1, 1))
    return scores


class LogisticEstimator:
    """Multinomial logistic regression (scikit-learn, lbfgs), fitted by scikit-learn and applied from its
    coefficients."""

    def __init__(self, *, C: float, n_classes: int, seed: int, params: Mapping[str, Any] | None = None) -> None:
        self.C = C
        self.n_classes = n_classes
        self.seed = seed
        self.params = dict(params or {})
        self.coef_: np.ndarray | None = None
        self.intercept_: np.ndarray | None = None

    def fit(self, X: Rows, y: np.ndarray) -> LogisticEstimator:
        from sklearn.linear_model import LogisticRegression

        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            self.coef_ = self.intercept_ = None
            return self
        kwargs = {"C": self.C, "max_iter": 5000, "random_state": self.seed % (2**32), **self.params}
        model = LogisticRegression(**kwargs).fit(np.asarray(X, dtype=np.float64), y)
        self.coef_, self.intercept_ = model.coef_, model.intercept_
        return self

    def predict_scores(self, X: Rows) -> np.ndarray:
        if self.coef_ is None or self.intercept_ is None:
            out = np.zeros((X.shape[0], self.n_classes))
            out[:, int(self.classes_[0])] = 1.0
            return out
        coef, intercept = self.coef_, self.intercept_

        def scores(rows: np.ndarray) -> np.ndarray:
            # A block of rows at a time (each in float64 while it is in the cache), as the encoders before it.
            return in_blocks(lambda block: logistic_proba(np.asarray(block, dtype=np.float64), coef, intercept),
                             rows, max(2, coef.shape[0]), np.float64)

        proba = by_chunks(scores, X)
        return full_proba(proba, self.classes_, self.n_classes)

    def get_state(self) -> dict[str, Any]:
        if self.coef_ is None:
            return {"classes": self.classes_}
        return {"classes": self.classes_, "coef": self.coef_, "intercept": self.intercept_}

    def set_state(self, state: Mapping[str, Any]) -> LogisticEstimator:
        self.classes_ = _array(state, "classes")
        if "coef" not in state:
            self.coef_ = self.intercept_ = None
            return self
        self.coef_, self.intercept_ = _array(state, "coef"), _array(state, "intercept")
        return self


class SklearnEstimator:
    """Any scikit-learn classifier (with ``predict_proba``) or regressor, by class name."""

    def __init__(self, name: str, params: dict[str, Any], *, task: Task, n_classes: int | None, seed: int) -> None:
        from sklearn.base import is_classifier, is_regressor

        cls = sklearn_estimators()[name]
        try:
            model = cls(**params)
        except TypeError as exc:
            raise ConfigError(f"{name} does not accept params {sorted(params)}: {exc}") from exc
        if "random_state" in model.get_params() and "random_state" not in params:
            model.set_params(random_state=seed % (2**32))
        if task == "regression" and not is_regressor(model):
            raise ConfigError(f"{name} is not a regressor, but the task is regression")
        if task != "regression":
            if not is_classifier(model):
                raise ConfigError(f"{name} is not a classifier, but the task is {task}")
            if not hasattr(model, "predict_proba"):
                raise ConfigError(f"{name} gives no class probabilities (predict_proba); choose another classifier "
                                  "or set the parameter that enables them (e.g. probability = true for SVC)")
        self.model = model
        self.task = task
        self.n_classes = n_classes

    def fit(self, X: Rows, y: np.ndarray) -> SklearnEstimator:
        self.model_ = self.model.fit(np.asarray(X, dtype=np.float64), y)
        return self

    def predict_scores(self, X: Rows) -> np.ndarray:
        X64 = np.asarray(X, dtype=np.float64)
        if self.task == "regression":
            return np.asarray(self.model_.predict(X64), dtype=np.float64)
        return full_proba(self.model_.predict_proba(X64), self.model_.classes_, _classes(self.task, self.n_classes))

    def get_state(self) -> dict[str, Any]:
        """The fitted model in skops' format, which loads without running code (no pickle)."""
        sio = _skops()
        return {"skops": np.frombuffer(sio.dumps(self.model_), dtype=np.uint8)}

    def set_state(self, state: Mapping[str, Any]) -> SklearnEstimator:
        sio = _skops()
        blob = _array(state, "skops").tobytes()
        # Only types scikit-learn and numpy define may come back: anything else is refused, not loaded.
        untrusted = sio.get_untrusted_types(data=blob)
        suspicious = [t for t in untrusted if not t.startswith(("sklearn.", "numpy.", "scipy.", "builtins."))]
        if suspicious:
            raise ConfigError(f"a saved scikit-learn model names types {suspicious[:5]} that are not scikit-learn's; "
                              "refused: the file is not one vflo wrote")
        self.model_ = sio.loads(blob, trusted=untrusted)
        return self


def _skops() -> Any:
    try:
        import skops.io as sio
    except ImportError as exc:
        raise ConfigError("saving or loading a scikit-learn model other than logistic or linear needs skops: "
                          "pip install 'vflo[artifacts]'") from exc
    return sio


class LinearEstimator:
    """Ridge regression (scikit-learn)."""

    def __init__(self, *, alpha: float) -> None:
        self.alpha = alpha

    def fit(self, X: Rows, y: np.ndarray) -> LinearEstimator:
        from sklearn.linear_model import Ridge

        self.model_ = Ridge(alpha=self.alpha).fit(np.asarray(X, dtype=np.float64), y)
        return self

    def predict_scores(self, X: Rows) -> np.ndarray:
        return np.asarray(self.model_.predict(np.asarray(X, dtype=np.float64)), dtype=np.float64)

    def get_state(self) -> dict[str, Any]:
        return {"coef": np.asarray(self.model_.coef_), "intercept": np.atleast_1d(self.model_.intercept_)}

    def set_state(self, state: Mapping[str, Any]) -> LinearEstimator:
        from sklearn.linear_model import Ridge

        model = Ridge(alpha=self.alpha)
        model.coef_ = _array(state, "coef")
        intercept = _array(state, "intercept")
        model.intercept_ = intercept if model.coef_.ndim == 2 else float(intercept[0])
        model.n_features_in_ = model.coef_.shape[-1]
        self.model_ = model
        return self


class MLPEstimator:
    """A PyTorch MLP trained with the project's fit loop (cross-entropy or MSE)."""

    def __init__(
        self, *, task: Task, n_classes: int | None, hidden: tuple[int, ...], activation: str,
        train: TrainConfig, seed: int,
    ) -> None:
        self.task = task
        self.n_classes = n_classes
        self.hidden = hidden
        self.activation = activation
        self.train = train
        self.seed = seed

    def fit(self, X: Rows, y: np.ndarray) -> MLPEstimator:
        # Regression may have several targets (y of shape (n, k)): one network with k outputs.
        self.outputs_ = int(y.shape[1]) if self.task == "regression" and y.ndim == 2 else None
        out = (self.outputs_ or 1) if self.task == "regression" else _classes(self.task, self.n_classes)
        from vflo.nn.models import mlp

        self.in_dim_ = int(X.shape[1])
        self.model_ = mlp(X.shape[1], self.hidden, out, activation=self.activation,
                          generator=torch_generator(self.seed, "mlp-init"))
        # Regression targets are standardised for training (Adam's steps assume unit scale) and mapped back.
        self.y_mean_: Any = 0.0
        self.y_scale_: Any = 1.0
        if self.task == "regression":
            y = np.asarray(y, dtype=np.float64)
            scale = np.std(y, axis=0)
            self.y_mean_ = np.mean(y, axis=0)
            self.y_scale_ = np.where(scale > 0, scale, 1.0) if y.ndim == 2 else float(scale or 1.0)
            y = (y - self.y_mean_) / self.y_scale_
        target = as_tensor(y, dtype=torch.float32 if self.task == "regression" else torch.long)
        # Rows are gathered a batch at a time from X as it is, in memory or on disk (no copy of every row).
        tensors = {"x": X if isinstance(X, DiskRows) else np.asarray(X), "y": target}
        self.history_: History = fit_module(
            self.model_, self._loss, tensors, config=self.train, rng=numpy_rng(self.seed, "mlp-batches"),
        )
        return self

    def _loss(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = model(batch["x"])
        if self.task == "regression":
            return F.mse_loss(out if self.outputs_ else out.squeeze(1), batch["y"])
        return F.cross_entropy(out, batch["y"])

    def get_state(self) -> dict[str, Any]:
        return {**module_state(self.model_, "net."), "in_dim": self.in_dim_,
                "outputs": self.outputs_ or 0, "y_mean": np.atleast_1d(np.asarray(self.y_mean_, dtype=np.float64)),
                "y_scale": np.atleast_1d(np.asarray(self.y_scale_, dtype=np.float64))}

    def set_state(self, state: Mapping[str, Any]) -> MLPEstimator:
        from vflo.nn.models import mlp

        outputs = int(state.get("outputs", 0))
        self.outputs_ = outputs or None
        self.in_dim_ = int(state["in_dim"])
        out = (self.outputs_ or 1) if self.task == "regression" else _classes(self.task, self.n_classes)
        self.model_ = mlp(int(state["in_dim"]), self.hidden, out, activation=self.activation,
                          generator=torch_generator(self.seed, "mlp-init"))
        load_module_state(self.model_, state, "net.")
        self.model_.eval()
        mean, scale = _array(state, "y_mean"), _array(state, "y_scale")
        self.y_mean_ = mean if self.outputs_ else float(mean[0])
        self.y_scale_ = scale if self.outputs_ else float(scale[0])
        return self

    def predict_scores(self, X: Rows) -> np.ndarray:
        if isinstance(X, DiskRows):
            return by_chunks(self.predict_scores, X)
        with torch.no_grad():
            out = self.model_(as_tensor(X))
        if self.task == "regression":
            raw = out.double().numpy() if self.outputs_ else out.squeeze(1).double().numpy()
            values: np.ndarray = raw * self.y_scale_ + self.y_mean_
            return values
        result: np.ndarray = torch.softmax(out, dim=1).double().numpy()
        return result
