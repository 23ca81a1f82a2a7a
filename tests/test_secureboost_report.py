"""The SecureBoost page's GOSS section is computed from the benchmark's runs: its claims are the runs' ratios."""

from __future__ import annotations

from benchmarks.reproduce.secureboost_report import goss_section


def _run(seed: int, accuracy: float, auc: float, seconds: float, enc: int, adds: int, dec: int) -> dict[str, float]:
    return {"seed": seed, "accuracy": accuracy, "roc_auc": auc, "fit_seconds": seconds, "encryptions": enc,
            "ciphertext_additions": adds, "sums_decrypted": dec}


def test_the_goss_section_says_what_the_runs_measured() -> None:
    bench = {"commit": "abc1234", "goss": {"trees": 10, "train_rows": 100, "runs": {
        "all": [_run(0, 0.82, 0.79, 100.0, 1000, 10_000, 900)],
        "goss 0.2/0.1": [_run(0, 0.81, 0.78, 50.0, 300, 4_000, 800), _run(1, 0.83, 0.78, 60.0, 300, 5_000, 850)]}}}
    lines, claims = goss_section(bench)
    text = "\n".join(lines)
    assert "| goss 0.2/0.1 | 2 | 82.00 (81.00-83.00) | 78.00 (78.00-78.00) | 300 | 4,500 | 825 | 55.0 |" in text
    assert claims == ["GOSS 0.2/0.1 (top/other), mean of 2 seeds: accuracy +0.00 points and ROC AUC -1.00 against "
                      "every person in every tree, 0.30 of the encryptions, 0.45 of the ciphertexts added, 0.92 of "
                      "the sums decrypted, 0.55 of the time."]
    lines, claims = goss_section({})
    assert "Not measured yet" in "\n".join(lines) and claims == []
