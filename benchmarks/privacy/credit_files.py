"""Two parties' own files from UCI Credit Card with text columns, for the privacy benchmark's table on a party
file that holds words (configs/privacy/credit_files.toml):

- ``bank.csv``: 8,000 clients: credit limit (X1), age (X5), repayment status (X6-X11) and the label as words
  (``default`` / ``paid``);
- ``bureau.csv``: 8,000 clients, 6,000 of them the bank's: sex, education and marital status as the UCI
  documentation's words, bill amounts (X12-X17) and payments (X18-X23).

The values are the real file's (read through vflo's loader, checksum verified); only the codes of X2-X4 and the
label are written as words (codes the documentation does not name as ``unknown``). Written under
``runs/privacy_files/`` (ignored by git), where the config reads them.

    python -m benchmarks.privacy.credit_files [--data-dir ../shared/datasets] [--out runs/privacy_files]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from vflo.data.datasets import load_dataset

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "runs" / "privacy_files"
SEX = {1: "male", 2: "female"}
EDUCATION = {1: "graduate school", 2: "university", 3: "high school", 4: "others"}
MARRIAGE = {1: "married", 2: "single", 3: "others"}
BANK_ROWS, BUREAU_FROM, ROWS = 8000, 2000, 10000


def write(data_dir: str | None, out: Path = OUT) -> tuple[Path, Path]:
    """The two files (written again only where missing)."""
    bank, bureau = out / "bank.csv", out / "bureau.csv"
    if bank.is_file() and bureau.is_file():
        return bank, bureau
    data = load_dataset("credit_default", data_dir)
    X = data.X.iloc[:ROWS].reset_index(drop=True)
    ids = pd.Series(data.ids[:ROWS], name="ID")
    label = pd.Series(["default" if v == 1 else "paid" for v in data.y[:ROWS]], name="default")
    own = pd.concat([ids, X[["X1", "X5", *(f"X{i}" for i in range(6, 12))]], label], axis=1)
    words = pd.DataFrame({"sex": X["X2"].map(SEX), "education": X["X3"].map(EDUCATION),
                          "marriage": X["X4"].map(MARRIAGE)}).fillna("unknown")
    theirs = pd.concat([ids, words, X[[f"X{i}" for i in range(12, 24)]]], axis=1)
    out.mkdir(parents=True, exist_ok=True)
    for frame, path in ((own.iloc[:BANK_ROWS], bank), (theirs.iloc[BUREAU_FROM:], bureau)):
        tmp = path.with_suffix(".tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(path)
    return bank, bureau


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    for path in write(args.data_dir, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
