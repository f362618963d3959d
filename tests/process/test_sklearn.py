"""``paramserver.sklearn.PSClassifier`` under scikit-learn's own estimator checks, and
``paramserver.load_model`` scoring files and matrices."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.utils.estimator_checks import parametrize_with_checks

import paramserver
from paramserver.sklearn import PSClassifier

pytestmark = pytest.mark.timeout(300)

SKIPPED = {  # only what a binary classifier without sample weights is not asked to do
    "check_classifiers_one_label": "one class is refused (binary only), with a clear message",
    "check_classifiers_one_label_sample_weights": "no sample weights",
    "check_classifiers_multilabel_representation_invariance": "binary only",
    "check_classifiers_multilabel_output_format_predict": "binary only",
    "check_classifiers_multilabel_output_format_predict_proba": "binary only",
    "check_classifiers_multilabel_output_format_decision_function": "binary only",
    "check_classifier_multioutput": "binary only",
    "check_classifiers_classes": "its data is multiclass: binary only",
    "check_fit_score_takes_y": "its data is multiclass: binary only",
    "check_supervised_y_2d": "binary only",
    "check_classifiers_regression_target": "binary only (a continuous y is refused, as it checks)",
    "check_sample_weight_equivalence_on_dense_data": "no sample weights",
    "check_sample_weight_equivalence_on_sparse_data": "no sample weights",
    "check_sample_weights_not_an_array": "no sample weights",
    "check_sample_weights_list": "no sample weights",
    "check_sample_weights_shape": "no sample weights",
    "check_sample_weights_not_overwritten": "no sample weights",
    "check_sample_weights_invariance": "no sample weights",
    "check_class_weight_classifiers": "no class weights",
    "check_class_weight_balanced_classifiers": "no class weights",
}


@parametrize_with_checks([PSClassifier()])
def test_scikit_learn_checks(estimator, check):
    name = getattr(check, "func", check).__name__
    if name in SKIPPED:
        pytest.skip(f"{name}: {SKIPPED[name]}")
    check(estimator)


def test_fit_predict_score_and_load_model_agree(tmp_path):
    X, y = make_classification(1500, 20, random_state=0)
    y = np.where(y == 1, "click", "none")  # any two labels
    clf = PSClassifier(epochs=3).fit(X[:1000], y[:1000])
    assert set(clf.predict(X[1000:])) <= {"click", "none"} and clf.score(X[1000:], y[1000:]) > 0.85
    proba = clf.predict_proba(X[1000:])
    assert proba.shape == (500, 2) and np.allclose(proba.sum(1), 1)
    with pytest.raises(ValueError, match="Only binary classification is supported"):
        PSClassifier().fit(X[:30], np.arange(30) % 3)


def test_load_model_scores_files_and_matrices(tmp_path):
    from sklearn.datasets import dump_svmlight_file

    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.train import TrainConfig, run_training
    from paramserver.data.reader import DataFormat
    X, y = make_classification(800, 12, random_state=1)
    path, model_dir = str(tmp_path / "d.svm"), str(tmp_path / "model")
    dump_svmlight_file(X, y, path, zero_based=False)
    run_training(TrainConfig(Model("lr"), DataFormat("libsvm")), [path], [], servers=1, workers=1, save=model_dir)
    model = paramserver.load_model(model_dir)
    from_file, from_matrix = model.predict_proba(path), model.predict_proba(X)
    np.testing.assert_allclose(from_file, from_matrix, rtol=1e-5)  # a matrix's column j is feature j + 1
    assert ((model.predict(X) == y).mean()) > 0.8
