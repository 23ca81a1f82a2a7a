"""PCA upload: against its centralised equivalent (PCA of each partner's own rows, a classifier on the joined
columns), and its own refusals. The common suite (tests/test_every_method.py) checks the rest."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression

from tests.test_methods import _split
from vflo.errors import MethodError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method


def test_what_a_partner_sends_is_the_pca_of_its_own_rows() -> None:
    data = _split(n=300, aligned=200, test=40)
    passive = data.train["pas"]
    seen: list = []
    run_method(get_method("pca")(components=2), data, seed=0, observers=(seen.append,))
    upload = next(m for m in seen if m.kind == "pca.upload" and m.sender == "pas")
    request = next(m for m in seen if m.kind == "pca.upload" and m.receiver == "pas")
    z = upload.payload["z"]
    assert z.shape[1] == 2 and z.shape[0] == int(request.payload["selector"].sum())
    # The same projection scikit-learn finds on every row the partner holds (fitted there, shared or not), up to
    # each component's sign, for the rows it shares.
    pca = PCA(n_components=2, svd_solver="full").fit(passive.X.astype(np.float64))
    act = data.train["act"]
    shared = np.sort(act.ids[np.isin(act.ids, passive.ids)])  # the aligned people, in the order of their IDs
    expected = pca.transform(passive.subset(shared).X.astype(np.float64))
    signs = np.sign(np.sum(expected * z, axis=0))
    assert np.allclose(z, expected * signs, atol=1e-4)


def test_the_classifier_is_a_logistic_regression_on_the_joined_columns() -> None:
    """The federated fit equals the same model fitted in one place on [own columns, partner's components]."""
    data = _split(n=300, aligned=1.0, test=40)
    method = get_method("pca")(components=2)
    fed, _nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    method.fit(fed)
    act, pas = data.train["act"], data.train["pas"]
    pca = PCA(n_components=2, svd_solver="full").fit(pas.X.astype(np.float64))
    order = pas.positions(act.ids)
    z = pca.transform(pas.X[order].astype(np.float64))
    reference = LogisticRegression(max_iter=1000).fit(np.hstack([act.X, z]), act.y)
    test = data.test_ids
    joined = np.hstack([data.serve["act"].subset(test).X, pca.transform(data.serve["pas"].subset(test).X)])
    ours = method.predict(fed, test)
    agree = (ours.argmax(1) == reference.predict_proba(joined).argmax(1)).mean()
    assert agree >= 0.95, agree


def test_a_partner_refuses_as_many_components_as_columns_and_a_second_upload() -> None:
    data = _split(n=200, aligned=1.0, test=20)
    width = data.train["pas"].n_features
    with pytest.raises((MethodError, RemoteError), match=f"components = {width} is not fewer than its {width} columns"):
        run_method(get_method("pca")(components=width), data, seed=0)
    method = get_method("pca")()
    fed, _nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    method.fit(fed)
    alignment = fed.align(fed.data.ids, ["pas"])
    with pytest.raises(RemoteError, match="sent its components for this run already"):
        fed.exchange("pca.upload", {"pas": {"selector": alignment.selector("pas")}})


def test_a_partner_projects_rows_to_score_only_after_its_upload() -> None:
    data = _split(n=200, aligned=1.0, test=20)
    method = get_method("pca")()
    fed, _nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    with pytest.raises(RemoteError, match="has no fitted components \\(pca.upload comes first\\); refused"):
        fed.request("pas", "pca.project", {"ids": data.test_ids[:3]})

