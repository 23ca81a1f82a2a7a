from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from vflo.errors import ConfigError
from vflo.nn.models import autoencoder, mlp, output_width
from vflo.nn.train import Callback, TrainConfig, fit_module, run_epochs, split_validation
from vflo.seeding import derive_seed, numpy_rng, torch_generator


def test_mlp_shapes_and_seeded_init() -> None:
    a = mlp(5, (8, 4), 3, generator=torch_generator(1, "x"))
    b = mlp(5, (8, 4), 3, generator=torch_generator(1, "x"))
    c = mlp(5, (8, 4), 3, generator=torch_generator(2, "x"))
    x = torch.randn(7, 5, generator=torch_generator(0))
    assert a(x).shape == (7, 3)
    assert torch.equal(a(x), b(x)) and not torch.equal(a(x), c(x))
    assert output_width(mlp(5, (8, 4), None, generator=torch_generator(0)), 5) == 4


def test_autoencoder_is_symmetric() -> None:
    ae = autoencoder(6, (16, 32), activation="selu", generator=torch_generator(0))
    z, x_hat = ae(torch.zeros(3, 6))
    assert z.shape == (3, 32) and x_hat.shape == (3, 6)
    widths = [m.out_features for m in ae.decoder.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [16, 6]


def test_bad_layer_sizes_and_activation() -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        mlp(3, (0,), 1, generator=torch_generator(0))
    with pytest.raises(ConfigError, match="unknown activation 'sellu'"):
        mlp(3, (4,), 1, activation="sellu", generator=torch_generator(0))


def test_train_config_validation() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="validation_fraction"):
        TrainConfig(validation_fraction=1.0)


def test_a_small_table_is_cut_into_min_batches_batches_an_epoch() -> None:
    """Epochs count passes over the rows: without this, a hundred rows at batch 128 are one step an epoch."""
    seen: list[int] = []

    def step(idx: np.ndarray) -> float:
        seen.append(len(idx))
        return 1.0

    run_epochs(n_train=108, config=TrainConfig(max_epochs=1, patience=0), rng=numpy_rng(0), train_step=step)
    assert seen == [27] * 4  # min_batches = 4 by default
    seen.clear()
    run_epochs(n_train=108, config=TrainConfig(max_epochs=1, patience=0, min_batches=1), rng=numpy_rng(0),
               train_step=step)
    assert seen == [108]  # batch_size as given (the papers' settings)
    assert TrainConfig(batch_size=64).batch_rows(256) == 64 and TrainConfig(batch_size=64).batch_rows(255) == 64
    assert TrainConfig(batch_size=64).batch_rows(200) == 50 and TrainConfig(batch_size=64).batch_rows(3) == 1
    with pytest.raises(ConfigError, match="min_batches"):
        TrainConfig(min_batches=0)


def test_split_validation_is_disjoint_and_seeded() -> None:
    tr, va = split_validation(100, 0.1, numpy_rng(0))
    assert len(va) == 10 and not set(tr) & set(va) and len(tr) + len(va) == 100
    _, va2 = split_validation(100, 0.1, numpy_rng(0))
    assert np.array_equal(va, va2)
    assert len(split_validation(5, 0.05, numpy_rng(0))[1]) == 0


def test_early_stopping_stops_after_patience() -> None:
    losses = iter([5.0, 4.0, 4.5, 4.6, 4.7, 4.8, 1.0])
    hist = run_epochs(n_train=4, config=TrainConfig(batch_size=4, max_epochs=50, patience=3), rng=numpy_rng(0),
                      train_step=lambda idx: 1.0, validate=lambda: next(losses))
    assert len(hist) == 5 and hist.stopped_early and hist.best_epoch == 1


def test_callbacks_can_stop_training() -> None:
    class StopAt2(Callback):
        def on_epoch_end(self, epoch: int, logs: object) -> bool:
            return epoch == 2

    hist = run_epochs(n_train=3, config=TrainConfig(max_epochs=10, patience=0), rng=numpy_rng(0),
                      train_step=lambda idx: 1.0, callbacks=[StopAt2()])
    assert len(hist) == 3 and hist["loss"] == [1.0, 1.0, 1.0]


def test_fit_module_learns_and_restores_the_best_weights() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 4)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    model = mlp(4, (16,), 2, generator=torch_generator(0))
    tensors = {"x": torch.tensor(X), "y": torch.tensor(y)}
    hist = fit_module(model, lambda m, b: F.cross_entropy(m(b["x"]), b["y"]), tensors,
                      config=TrainConfig(lr=1e-2, batch_size=32, max_epochs=30, patience=5), rng=numpy_rng(0))
    assert hist["val_loss"][-1] < hist["val_loss"][0]
    acc = (model(torch.tensor(X)).argmax(1).numpy() == y).mean()
    assert acc > 0.9
    best = min(hist["val_loss"])
    val_pos = split_validation(400, 0.1, numpy_rng(0))[1]
    with torch.no_grad():
        restored = float(F.cross_entropy(model(tensors["x"][val_pos]), tensors["y"][val_pos]))
    assert restored == pytest.approx(best, rel=1e-5)


def test_derived_seeds_depend_on_every_key() -> None:
    assert derive_seed(1, "a") == derive_seed(1, "a")
    assert len({derive_seed(1, "a"), derive_seed(1, "b"), derive_seed(2, "a"), derive_seed(1, "a", 0)}) == 4


def test_layer_words_build_the_papers_networks() -> None:
    from vflo.nn.layers import build, output_size, validate

    guest = build(76, ["linear 120", "linear 70", "relu"], generator=torch_generator(0))
    assert output_size(guest, 76) == 70 and len(guest) == 3
    cnn = build(392, ["reshape 1 28 14", "conv 8 3", "relu", "maxpool 2", "flatten", "linear 16"],
                generator=torch_generator(0))
    assert output_size(cnn, 392) == 16
    again = build(392, ["reshape 1 28 14", "conv 8 3", "relu", "maxpool 2", "flatten", "linear 16"],
                  generator=torch_generator(0))
    x = torch.rand(2, 392, generator=torch_generator(1))
    assert torch.equal(cnn(x), again(x))
    for bad, message in [(["linear"], "takes 1 number"), (["conv 8"], "takes 2 number"),
                         (["flatten 3"], "takes no numbers"), (["relu", "softmaxx"], "unknown layer")]:
        with pytest.raises(ConfigError, match=message):
            validate(bad, "test")
    with pytest.raises(ConfigError, match="cannot reshape"):
        build(10, ["reshape 1 3 3"], generator=torch_generator(0))
    with pytest.raises(ConfigError, match="needs a flat input"):
        build(9, ["reshape 1 3 3", "linear 2"], generator=torch_generator(0))


def test_resnet18_guest_needs_a_gpu_and_says_so() -> None:
    from vflo.errors import MethodError
    from vflo.nn.layers import build

    if torch.cuda.is_available():  # pragma: no cover - no GPU where the tests run
        pytest.skip("a GPU is present")
    with pytest.raises(MethodError, match="needs a CUDA GPU"):
        build(784, ["reshape 1 28 28", "resnet18"], generator=torch_generator(0))


def test_encoding_in_blocks_over_workers_gives_the_numbers_of_one_single_threaded_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo import blocks
    from vflo.nn.distill import FittedAutoencoder
    from vflo.nn.estimators import LogisticEstimator
    from vflo.nn.train import History

    model = autoencoder(6, (32, 16), activation="selu", generator=torch_generator(0, "blocks"))
    fitted = FittedAutoencoder(model=model, history=History())
    X = numpy_rng(0, "rows").normal(size=(2 * blocks.BLOCK + 301, 6)).astype(np.float32)
    with torch.no_grad():
        torch.set_num_threads(1)
        plain = model.encoder(torch.from_numpy(X)).numpy()
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # three workers, more than this machine's cores
    together = fitted.encode(X)
    assert torch.get_num_threads() == before  # the process's setting is given back
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    alone = fitted.encode(X)
    # The same bits as one single-threaded pass over all rows, with three workers or one.
    assert together.dtype == np.float32 and np.array_equal(together, plain) and np.array_equal(alone, plain)
    assert fitted.encode(X[:0]).shape == (0, 16)

    # The classifier after it: in blocks over two workers, the numbers of one pass over all rows at once.
    from vflo.nn.estimators import logistic_proba

    est = LogisticEstimator(C=1.0, n_classes=2, seed=0).fit(X, (X[:, 0] > 0).astype(int))
    assert est.coef_ is not None and est.intercept_ is not None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    whole = logistic_proba(X.astype(np.float64), est.coef_, est.intercept_)
    assert np.array_equal(est.predict_scores(X), whole)
