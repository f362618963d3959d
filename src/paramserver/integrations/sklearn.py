"""A scikit-learn estimator that trains on a local cluster, and ``load_model``'s inputs.

    >>> from paramserver.integrations.sklearn import PSClassifier                   # doctest: +SKIP
    >>> clf = PSClassifier(model="fm", epochs=3).fit(X_train, y_train)
    >>> clf.predict_proba(X_test)[:, 1], clf.score(X_test, y_test)

``X`` is a dense array or a scipy sparse matrix: column ``j`` is the LIBSVM feature
``j + 1`` (its value, hashed to a key as the LIBSVM reader does), so a model fitted here
also scores LIBSVM files, and ``paramserver.load_model(DIR)`` of a LIBSVM model scores
``X`` the same way.  ``fit`` writes ``X`` as a LIBSVM file in a temporary folder and runs
``paramserver train`` on a fresh ``LocalCluster``; it needs scikit-learn only to be a
scikit-learn estimator (``BaseEstimator``, ``ClassifierMixin``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from paramserver.apps.ctr.modelfile import LocalModel, rows_to_batch


class PSClassifier(ClassifierMixin, BaseEstimator):
    """Binary classifier trained by paramserver (logistic regression or a factorization
    machine) on a local cluster; the arguments are ``paramserver train``'s flags."""

    def __init__(self, model: str = "lr", k: int = 8, epochs: int = 1, batch_size: int = 4000,
                 hash_bits: int = 24, optimizer: Any = None, servers: int = 1, workers: int = 1, seed: int = 0):
        self.model, self.k, self.epochs, self.batch_size = model, k, epochs, batch_size
        self.hash_bits, self.optimizer, self.seed = hash_bits, optimizer, seed
        self.servers, self.workers = servers, workers

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False  # binary: the checks use two classes
        tags.input_tags.sparse = True  # scipy sparse X, as a CTR matrix is
        return tags

    def fit(self, X: Any, y: Any) -> PSClassifier:
        from paramserver.apps.ctr.models import Model
        from paramserver.apps.ctr.train import run_training
        from paramserver.apps.ctr.train_config import TrainConfig
        from paramserver.data.reader import DataFormat

        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float32)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if type_of_target(y) != "binary" or self.classes_.size != 2:
            raise ValueError(f"Only binary classification is supported: PSClassifier needs y with 2 classes, got "
                             f"{self.classes_.size} class{'es' if self.classes_.size != 1 else ''} "
                             f"({type_of_target(y)} target)")
        labels = (y == self.classes_[1]).astype(np.int8)
        with tempfile.TemporaryDirectory(prefix="paramserver-fit-") as tmp:
            path, saved = os.path.join(tmp, "train.svm"), os.path.join(tmp, "model")
            _write_libsvm(path, X, labels)
            cfg = TrainConfig(Model(self.model, self.k), DataFormat("libsvm", self.hash_bits, "01"),
                              optimizer=self.optimizer, epochs=self.epochs, batch_size=self.batch_size, seed=self.seed)
            run_training(cfg, [path], [], servers=self.servers, workers=self.workers, save=saved)
            self.model_ = LocalModel(saved)
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False, accept_sparse="csr", dtype=np.float32)
        p = self.model_.proba(rows_to_batch(X, self.hash_bits))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        classes: np.ndarray = self.classes_[(self.predict_proba(X)[:, 1] > 0.5).astype(int)]
        return classes


def _write_libsvm(path: str, X: Any, labels: np.ndarray) -> None:
    import scipy.sparse as sp
    from sklearn.datasets import dump_svmlight_file  # compiled, and writes what our reader reads

    if sp.issparse(X):  # its writer takes 32-bit indices
        X = sp.csr_matrix(X)
        X.indices, X.indptr = X.indices.astype(np.int32), X.indptr.astype(np.int64)
    dump_svmlight_file(X, labels, path, zero_based=False)
