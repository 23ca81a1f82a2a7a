"""Write the two small example files the own-files example and its tests use (run once; output committed).

    python examples/data/make_example.py

A hospital (the active party: patient ID, outcome, six columns of which two are text) and a lab (seven
columns; ferritin, not measured for every patient, has gaps) that hold partly the same patients: 150 and 120
rows, 100 shared, in their own order, IDs as text. The outcome depends on columns of both, so working together should beat the hospital alone.
`hospital_new.csv` holds next month's 30 patients, without outcome, whom the lab has never seen: what a
model saved with `--save` scores from the hospital's file alone (README, "Train once, score later").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent


def main() -> None:
    rng = np.random.default_rng(7)
    n = 170  # 50 hospital-only, 100 shared, 20 lab-only
    ids = np.array([f"P{i:04d}" for i in rng.choice(10_000, size=n, replace=False)])
    age = rng.integers(18, 90, size=n)
    bmi = rng.normal(27, 5, size=n).round(1)
    sex = rng.choice(["F", "M"], size=n)
    ward = rng.choice(["cardio", "general", "ortho"], size=n)
    systolic = rng.normal(130, 18, size=n).round(0)
    stay_days = rng.poisson(4, size=n)
    lab = rng.normal(size=(n, 7))
    risk = (0.03 * (age - 50) + 0.6 * (ward == "cardio") + 0.02 * (systolic - 130) + 1.2 * lab[:, 0]
            - 0.9 * lab[:, 1] + 0.7 * lab[:, 2] * lab[:, 3] + 0.5 * rng.normal(size=n))
    outcome = np.where(risk > np.median(risk), "readmitted", "recovered")
    hospital = pd.DataFrame({"pid": ids, "age": age, "bmi": bmi, "sex": sex, "ward": ward, "systolic": systolic,
                             "stay_days": stay_days, "outcome": outcome}).iloc[:150]
    names = ["crp", "hba1c", "ldl", "creatinine", "sodium", "potassium", "ferritin"]
    lab_table = pd.DataFrame(lab.round(3), columns=names)
    # Not every patient had ferritin measured: about one in ten has no value (drawn apart, so every other file
    # is as before).
    lab_table.loc[np.random.default_rng(9).random(n) < 0.1, "ferritin"] = np.nan
    lab_table.insert(0, "pid", ids)
    lab_table = lab_table.iloc[50:]
    hospital.sample(frac=1.0, random_state=1).to_csv(HERE / "hospital.csv", index=False)
    lab_table.sample(frac=1.0, random_state=2).to_csv(HERE / "lab.csv", index=False)
    new_patients(np.random.default_rng(8), 30).to_csv(HERE / "hospital_new.csv", index=False)


def new_patients(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """The hospital's columns for patients admitted after training (IDs Q...: never in either file)."""
    return pd.DataFrame({"pid": [f"Q{i:04d}" for i in rng.choice(10_000, size=n, replace=False)],
                         "age": rng.integers(18, 90, size=n), "bmi": rng.normal(27, 5, size=n).round(1),
                         "sex": rng.choice(["F", "M"], size=n),
                         "ward": rng.choice(["cardio", "general", "ortho"], size=n),
                         "systolic": rng.normal(130, 18, size=n).round(0), "stay_days": rng.poisson(4, size=n)})


if __name__ == "__main__":
    main()
